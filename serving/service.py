"""Answers one recommendation request: the typed answer HTTP serves and the CLI prints.

``Recommender`` holds the loaded ``CatalogState`` and ``Pipeline`` and, when served online,
the worker's ``OnlineState`` (Redis) and the versions it reports beyond the stages' (the active
prompt), all given to its constructor: ``Recommender.build`` asks the worker's ``OnlineBackend``
for them (``OnlineBackend.link``) before the recommender exists, so a built one is never
rewired. ``respond`` runs one request as a list of small steps,
top to bottom:

1. assign the user's experiment arm (``recsys.experiments``, salted hash);
2. choose the route (``serving.policy``): LLM path or light, after the arm's overrides;
3. read the user's online history and its version (the split's while Redis is down);
4. look the answer up in the result cache ("cache"), when it may serve;
5. build the pipeline ``Request`` once (deadline counted from arrival, the arm's variant);
6. run the pipeline (the arm's), the LLM stages skipped on the light path;
7. build the response (``serving.response``): "llm", "light" or "fallback"; an ``explain`` request's
   top items get their reasons (``serving.explaining``; such answers skip the result cache);
8. store it in the result cache (never a fallback);
9. stamp ``total_ms``, record the metrics and log the impressions.

While Redis is down the answer comes from the split's in-memory histories without the cache
and is marked ``degraded``. ``recommend`` is the same answer as the JSON object the route
serves (``serving.run.recommend_once``, the demo).

An LLM stage whose artifacts fail to load is disabled (logged), never fatal: the policy then
sends everyone down the light path. Other stages failing to load still fail start-up.

With an active experiment, the variant's overrides (LLM share or opt-in, fusion weights)
apply, the answer carries ``experiment`` and ``variant``, and the items shown are logged as
impressions on the events stream (``impressions_logged``; not while Redis is down).

Deliberately left out: HTTP status codes and threads (``serving.app``), process start-up
(``serving.run``), the answer's shape (``serving.response``). A ``PipelineError`` (a
fail-closed stage failed) propagates to the caller.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from cascade.registry import build_stage
from cascade.settings import Settings
from recsys.contract import Request, StageTrace
from recsys.digest import json_sha256
from recsys.experiments import Assignment, ExperimentsConfig, active_experiment, assign
from recsys.pipeline import Pipeline, PipelineResult, PipelineSnapshot
from recsys.redis_client import RedisUnavailable
from serving.catalog_state import CatalogState
from serving.explaining import Explanations
from serving.metrics import ServingMetrics
from serving.online_backend import OnlineBackend
from serving.online_state import OnlineState
from serving.policy import Route, choose_route, result_cache_key
from serving.response import Served, build_response, stage_handoffs
from serving.schemas import RecommendRequest, RecommendResponse, StageHandoff
from serving.stage_loading import load_pipeline

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Clock:
    """When a request arrived (perf_counter, for ``total_ms``) and when its answer is due (monotonic)."""

    t0: float
    deadline: float

    @classmethod
    def start(cls, budget_ms: float) -> Clock:
        return cls(time.perf_counter(), time.monotonic() + budget_ms / 1000)

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.t0


@dataclass(frozen=True)
class OnlineHistory:
    """The user's history from Redis (None: the split's), its version, and whether Redis was down."""

    items: np.ndarray | None = None
    version: int = 0
    degraded: bool = False


@dataclass(frozen=True)
class CacheLookup:
    """A cached answer stamped for this request (None: miss or no lookup), and whether Redis failed."""

    answer: RecommendResponse | None = None
    degraded: bool = False


@dataclass(frozen=True)
class PipelineRun:
    result: PipelineResult
    handoffs: list[StageHandoff]  # filled for debug requests only


class Recommender:
    """Loaded state plus pipeline; built once per process by the app's start-up or the CLI.

    ``online`` is the worker's Redis state (None: offline, the split's histories and no result
    cache); ``extra_versions`` gives the versions answers report beside the stages' (the active
    prompt version); ``explanations`` the reason writer (built here unless given: the worker hands
    its own, which its prompt watcher keeps on the active template).
    """

    def __init__(self, settings: Settings, catalog: CatalogState, pipeline: Pipeline,
                 metrics: ServingMetrics | None = None, artifact_dir: Path | None = None, *,
                 online: OnlineState | None = None, extra_versions: Callable[[], dict[str, str]] = dict,
                 explanations: Explanations | None = None):
        self.settings = settings
        self.catalog = catalog
        self.pipeline = pipeline
        self.artifact_dir = artifact_dir  # a reload rebuilds the served recommender from it
        self.metrics = metrics or ServingMetrics()
        self.llm_stages = frozenset(spec.name for spec, _ in pipeline.stages if spec.kind == "llm")
        self.llm_available = any(spec.kind == "llm" and spec.enabled for spec, _ in pipeline.stages)
        # enabled in the config but not in the pipeline: it failed to load (route llm_unavailable, not llm_disabled)
        self.llm_configured = any(spec.kind == "llm" and spec.enabled for spec in settings.pipeline.stages)
        self.online = online
        self.extra_versions = extra_versions
        self.experiment = active_experiment(settings)
        self.variant_pipelines = variant_pipelines(pipeline, self.experiment, settings)
        # what the answers depend on beyond the model versions: a depth, a recall param, a popularity share
        # change what is served from the same trained files, so the result cache must not mix them
        self.config_digest = settings_digest(settings)
        # loads on first use
        self.explanations = explanations or Explanations(settings, catalog, pipeline, artifact_dir)

    @classmethod
    def load(cls, settings: Settings, artifact_dir: Path, pipeline: Pipeline | None = None,
             metrics: ServingMetrics | None = None, backend: OnlineBackend | None = None) -> Recommender:
        """Read the catalog from ``artifact_dir/split``; build and load the pipeline unless given (its LLM
        stage sharing ``backend``'s Redis client); ``build`` it on ``backend`` when given."""
        catalog = CatalogState.load(artifact_dir)
        if pipeline is None:
            pipeline = load_pipeline(settings, Path(artifact_dir), redis=None if backend is None else backend.client)
        return cls.build(settings, catalog, pipeline, metrics, Path(artifact_dir), backend,
                         preload=settings.llm.explain.preload)

    @classmethod
    def build(cls, settings: Settings, catalog: CatalogState, pipeline: Pipeline, metrics: ServingMetrics | None,
              artifact_dir: Path | None, backend: OnlineBackend | None, *, preload: bool = False) -> Recommender:
        """A recommender over loaded ``catalog`` and ``pipeline``, served on ``backend``'s online state
        (``OnlineBackend.link``: the active rule and prompt versions are installed before it serves)
        when given, else offline; ``preload`` starts loading the backbone for reasons at once."""
        if backend is None:
            recommender = cls(settings, catalog, pipeline, metrics, artifact_dir)
        else:
            metrics = metrics or ServingMetrics()
            explanations = Explanations(settings, catalog, pipeline, artifact_dir, backend.client)
            link = backend.link(catalog, pipeline, explanations, metrics)
            recommender = cls(settings, catalog, pipeline, metrics, artifact_dir, online=link.state,
                              extra_versions=link.versions, explanations=explanations)
        if preload:
            recommender.explanations.start_loading()
        return recommender

    def versions(self) -> dict[str, str]:
        return {**self.pipeline.versions(), **self.extra_versions()}

    def recommend(self, body: RecommendRequest, request_id: str | None = None) -> dict[str, Any]:
        """``respond``'s answer as the JSON object POST /v1/recommend serves (CLI, demo)."""
        return self.respond(body, request_id).as_json()

    def respond(self, body: RecommendRequest, request_id: str | None = None, *,
                log_impressions: bool = True) -> RecommendResponse:
        """The API answer for ``body`` (limits are the caller's to check first); called by the route.

        ``log_impressions`` False: an experiment's user is served in their arm, but the items shown are
        not logged as impressions (the console's requests).
        """
        clock = Clock.start(self.settings.pipeline.request_budget_ms)
        request_id = request_id or uuid.uuid4().hex
        arm = assign(self.experiment, body.user_id) if self.experiment is not None else None
        route = self._route(body, arm)
        online = self._read_history(body.user_id)
        # one snapshot of the stages (rules swapped meanwhile included): the cache key, the run and the
        # answer's versions all come from it, so an answer is labelled and cached with what ran
        pipeline = self.variant_pipelines.get(arm.variant, self.pipeline) if arm else self.pipeline
        snapshot, extra = pipeline.snapshot(), self.extra_versions()
        cache_key = self._cache_key(body, arm, route, online, {**snapshot.versions, **extra})
        hit = self._cache_lookup(cache_key, request_id)
        if hit.answer is not None:
            return self._finish(hit.answer, [], arm if log_impressions else None, clock)
        request = self.catalog.request_for(
            body.user_id, body.k, context=body.context, debug=body.debug, request_id=request_id,
            online_history=online.items, deadline=clock.deadline, variant=arm.variant if arm else None,
        )
        run = self._run(request, route, pipeline, snapshot)
        served = Served(route.reason, online.degraded or hit.degraded, arm, extra, run.handoffs)
        answer = build_response(request, run.result, self.catalog, self.llm_stages, served, clock.t0)
        if body.explain:  # after the answer is built; its own budget, within the request's
            answer = self.explanations.explain(request, run.result.candidates, answer, body.explain_k, self.online)
        if cache_key is not None and answer.path != "fallback":  # never pin a degraded answer
            self._store(cache_key, answer)
        return self._finish(answer, run.result.traces, arm if log_impressions else None, clock)

    def _route(self, body: RecommendRequest, arm: Assignment | None) -> Route:
        """The policy's route under the arm's overrides (a request's own ``llm`` still wins); counted."""
        cfg = self.settings.serving
        over = self.experiment.overrides(arm.variant) if self.experiment is not None and arm is not None else None
        share = over.llm_share if over is not None and over.llm_share is not None else cfg.llm_share
        opt = body.llm if body.llm is not None or over is None else over.llm
        route = choose_route(body.user_id, opt, share, cfg.policy_salt, self.llm_available, self.llm_configured)
        self.metrics.routes.labels(route.reason).inc()
        return route

    def _read_history(self, user_id: str) -> OnlineHistory:
        if self.online is None:
            return OnlineHistory()
        try:
            history, version = self.online.history(user_id, self.catalog.user_index.get(user_id))
        except RedisUnavailable as exc:
            self.metrics.redis_errors.inc()
            log.debug("history of %s from the split: %s", user_id, exc)
            return OnlineHistory(degraded=True)
        return OnlineHistory(history, version)

    def _cache_key(self, body: RecommendRequest, arm: Assignment | None, route: Route,
                   online: OnlineHistory, ran: dict[str, str]) -> str | None:
        """The result cache key (``ran``: the versions the request runs), or None when the cache may not
        serve (offline, Redis down, off, debug)."""
        if (self.online is None or online.degraded or self.settings.serving.result_cache_ttl_s <= 0 or body.debug
                or body.explain):  # reasons have their own cache (llm_rerank.reason_cache)
            return None
        versions = {**ran, "config": self.config_digest,
                    **({"variant": f"{arm.experiment}:{arm.variant}"} if arm else {})}
        return result_cache_key(body.user_id, body.k, body.context, online.version, versions, route.llm)

    def _cache_lookup(self, key: str | None, request_id: str) -> CacheLookup:
        """The cached answer under ``key`` as this request's (path "cache"); an unreadable entry is a miss."""
        if key is None or self.online is None:
            return CacheLookup()
        try:
            raw = self.online.cached_result(key)
        except RedisUnavailable:
            self.metrics.redis_errors.inc()
            return CacheLookup(degraded=True)
        answer = None
        if raw is not None:
            try:
                answer = RecommendResponse.model_validate(
                    {**raw, "request_id": request_id, "path": "cache", "degraded": False, "total_ms": 0.0,
                     "stages": cached_stages(raw.get("stages"))})
            except (TypeError, ValidationError) as exc:  # written by an older schema, or not by us
                log.warning("result cache entry %s unreadable, recomputing: %s", key, exc)
        self.metrics.cache.labels("hit" if answer is not None else "miss").inc()
        return CacheLookup(answer)

    def _run(self, request: Request, route: Route, pipeline: Pipeline, snapshot: PipelineSnapshot) -> PipelineRun:
        """``snapshot`` of the request variant's ``pipeline``, the LLM stages skipped off the LLM route."""
        handoffs: list[StageHandoff] = []
        observe = stage_handoffs(pipeline, self.catalog, handoffs) if request.debug else None
        result = pipeline.run(request, skip=() if route.llm else self.llm_stages, observe=observe, snapshot=snapshot)
        return PipelineRun(result, handoffs)

    def _store(self, key: str, answer: RecommendResponse) -> None:
        if self.online is None:
            return
        keep = answer.model_dump(mode="json", exclude_unset=True,
                                 exclude={"request_id", "total_ms", "impressions_logged"})
        try:
            self.online.store_result(key, keep, self.settings.serving.result_cache_ttl_s)
        except RedisUnavailable:
            self.metrics.redis_errors.inc()

    def _finish(self, answer: RecommendResponse, traces: list[StageTrace], arm: Assignment | None,
                clock: Clock) -> RecommendResponse:
        """The last step of every answer: stamp ``total_ms``, record the metrics, log the impressions."""
        answer = answer.model_copy(update={"total_ms": round(clock.elapsed_s() * 1000, 3)})
        self.metrics.observe_answer(answer.path, clock.elapsed_s(), traces)
        if answer.degraded:
            self.metrics.degraded.inc()
        return answer.model_copy(update={"impressions_logged": self._log_impressions(answer, arm)})

    def _log_impressions(self, answer: RecommendResponse, arm: Assignment | None) -> bool:
        """Record the items shown to an experiment's user on the events stream (best effort); done?"""
        if arm is None or self.online is None or answer.degraded or not answer.items:
            return False
        ts = f"{time.time():.3f}"
        entries = [{"user_id": answer.user_id, "item_id": item.id, "type": "impression", "ts": ts,
                    "experiment": arm.experiment, "variant": arm.variant, "request_id": answer.request_id,
                    "rank": str(item.rank)} for item in answer.items]
        try:
            self.online.log_impressions(entries)
        except RedisUnavailable:
            self.metrics.redis_errors.inc()
            return False
        return True


def variant_pipelines(
    pipeline: Pipeline, experiment: ExperimentsConfig | None, settings: Settings
) -> dict[str, Pipeline]:
    """Per variant with ``fusion_weights``: the pipeline with its fusion stages re-weighted.

    The other stages are the same loaded objects (no second copy of any model), so a rules
    or prompt hot swap reaches every variant.
    """
    if experiment is None:
        return {}
    out = {}
    for variant in experiment.variants:
        weights = variant.overrides.fusion_weights
        if weights is None:
            continue
        pairs = [(spec, build_stage(spec.model_copy(update={"params": {**spec.params, "weights": weights}}),
                                    settings) if spec.kind == "fusion" else stage)
                 for spec, stage in pipeline.stages]
        out[variant.name] = Pipeline(pairs, request_budget_ms=pipeline.request_budget_ms)
    return out


def cached_stages(stages: Any) -> Any:
    """The stage list of a cached answer as this request's: no stage ran, so each is ``cached`` in 0 ms, its
    reason saying how it ran when the answer was computed (an 800 ms LLM stage is not this hit's time).

    >>> cached_stages([{"name": "llm", "status": "ok", "ms": 812.4, "n_in": 50, "n_out": 20, "reason": ""}])
    [{'name': 'llm', 'status': 'cached', 'ms': 0.0, 'n_in': 50, 'n_out': 20, 'reason': 'result cache: ok in 812.4 ms when computed'}]
    """
    if not isinstance(stages, list):
        return stages  # not an answer we wrote: validation refuses it
    out = []
    for stage in stages:
        if not isinstance(stage, dict):
            return stages
        was = f"result cache: {stage.get('status')} in {stage.get('ms')} ms when computed"
        out.append({**stage, "status": "cached", "ms": 0.0,
                    "reason": f"{was} ({stage['reason']})" if stage.get("reason") else was})
    return out


class ServiceSlot:
    """Where the app keeps its ``Recommender``: empty while artifacts load, or the load error.

    Written once by the start-up task, read by every request (readiness and the routes).
    """

    def __init__(self, recommender: Recommender | None = None):
        self.recommender = recommender
        self.error: str | None = None
        self.damaged_file: str | None = None  # the artifact file a failed load refused, if that was the cause
        self.reload_refused: dict[str, str | None] | None = None  # the last POST /admin/reload, when refused

    def failed(self, exc: BaseException, damaged: Path | None = None) -> None:
        """Record why loading failed (readiness says it; ``POST /admin/reload`` can still succeed)."""
        self.error = f"{type(exc).__name__}: {exc}"
        self.damaged_file = None if damaged is None else str(damaged)

    def serve(self, recommender: Recommender) -> None:
        """Serve ``recommender`` from the next request on (one assignment); a past load error is over."""
        self.recommender = recommender
        self.error = self.damaged_file = None
        self.reload_refused = None

    def refused(self, detail: str, damaged: Path | None) -> None:
        """Record a refused reload (readiness names it while the previous artifacts keep serving)."""
        self.reload_refused = {"detail": detail, "damaged_file": None if damaged is None else str(damaged)}

    @property
    def status(self) -> str:
        if self.recommender is not None:
            return "ready"
        return "failed" if self.error is not None else "loading"

    def describe(self) -> str:
        if self.status == "failed":
            return f"service not ready: loading artifacts failed: {self.error}"
        return f"service {self.status}" if self.status == "ready" else "service not ready: loading artifacts"


# the serving settings an answer depends on (which path a user takes, what history it reads); the rest
# (where to listen, limits, timeouts, Redis plumbing) does not change an answer
ANSWER_SERVING_KEYS = frozenset({"llm_share", "policy_salt", "history_max_len", "history_event_types"})


def settings_digest(settings: Settings) -> str:
    """A digest of the settings answers depend on: every section but where things live
    (``artifacts_dir``, ``redis_url``) and the serving plumbing (``ANSWER_SERVING_KEYS`` kept), key
    order ignored; two processes share cached answers only when they would compute the same ones."""
    data = settings.model_dump(mode="json", exclude={"artifacts_dir", "redis_url"})
    data["serving"] = {k: v for k, v in data["serving"].items() if k in ANSWER_SERVING_KEYS}
    return json_sha256(data)[:16]
