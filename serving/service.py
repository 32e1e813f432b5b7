"""Answers one recommendation request as the API's JSON: the code HTTP and the CLI share.

``Recommender`` holds the loaded ``CatalogState`` and ``Pipeline`` and, when served online,
the worker's ``OnlineState`` (Redis). ``recommend`` applies the traffic policy
(``serving.policy``): it reads the user's online history and its version, answers from the
result cache when it can ("cache"), else runs the pipeline with the LLM stages skipped
("light") or not ("llm", or "fallback" when a stage fell back), with the request deadline
counted from arrival. While Redis is down it answers from the split's in-memory histories
without the cache and marks the answer ``degraded``. The route and
``serving.run.recommend_once`` both return exactly that dict.

An LLM stage whose artifacts fail to load is disabled (logged), never fatal: the policy then
sends everyone down the light path. Other stages failing to load still fail start-up.

With an active experiment (``recsys.experiments``), each user is assigned a variant by
salted hash; the variant's overrides (LLM share or opt-in, fusion weights) apply, the answer
carries ``experiment`` and ``variant``, and the items shown are logged as impressions on the
events stream (``impressions_logged``; not while Redis is down).

Deliberately left out: HTTP status codes and threads (``serving.app``), process start-up
(``serving.run``). A ``PipelineError`` (a fail-closed stage failed) propagates to the caller.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cascade.registry import build_stage
from cascade.settings import Settings
from recsys.contract import Candidates, Request, StageTrace
from recsys.experiments import Assignment, ExperimentsConfig, active_experiment, assign
from recsys.pipeline import Pipeline, PipelineResult
from recsys.redis_state import RedisUnavailable
from serving.metrics import ServingMetrics
from serving.policy import choose_route, result_cache_key
from serving.schemas import RecommendRequest
from serving.stage_loading import load_pipeline
from serving.state import CatalogState

if TYPE_CHECKING:
    from serving.online import OnlineState

log = logging.getLogger(__name__)


class Recommender:
    """Loaded state plus pipeline; built once per process by the app's start-up or the CLI."""

    def __init__(self, settings: Settings, catalog: CatalogState, pipeline: Pipeline,
                 metrics: ServingMetrics | None = None):
        self.settings = settings
        self.catalog = catalog
        self.pipeline = pipeline
        self.metrics = metrics or ServingMetrics()
        self.llm_stages = frozenset(spec.name for spec, _ in pipeline.stages if spec.kind == "llm")
        self.llm_available = any(spec.kind == "llm" and spec.enabled for spec, _ in pipeline.stages)
        self.online: OnlineState | None = None  # attached by serving.backend when serving online
        self.extra_versions: Callable[[], dict[str, str]] = dict  # e.g. the active prompt version
        self.experiment = active_experiment(settings)
        self.variant_pipelines = variant_pipelines(pipeline, self.experiment, settings)

    @classmethod
    def load(cls, settings: Settings, artifact_dir: Path, pipeline: Pipeline | None = None,
             metrics: ServingMetrics | None = None) -> Recommender:
        """Read the catalog from ``artifact_dir/split``; build and load the pipeline unless given."""
        catalog = CatalogState.load(artifact_dir)
        if pipeline is None:
            pipeline = load_pipeline(settings, Path(artifact_dir))
        return cls(settings, catalog, pipeline, metrics)

    def versions(self) -> dict[str, str]:
        return {**self.pipeline.versions(), **self.extra_versions()}

    def recommend(self, body: RecommendRequest, request_id: str | None = None) -> dict[str, Any]:
        """The API answer for ``body`` (limits are the caller's to check first)."""
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.settings.pipeline.request_budget_ms / 1000
        cfg = self.settings.serving
        experiment = self.experiment
        arm = assign(experiment, body.user_id) if experiment is not None else None
        over = experiment.overrides(arm.variant) if experiment is not None and arm is not None else None
        share = over.llm_share if over is not None and over.llm_share is not None else cfg.llm_share
        opt = body.llm if body.llm is not None or over is None else over.llm
        route = choose_route(body.user_id, opt, share, cfg.policy_salt, self.llm_available)
        self.metrics.routes.labels(route.reason).inc()
        history, history_version, degraded = self._online_history(body.user_id)
        cache_key = None
        if self.online is not None and not degraded and cfg.result_cache_ttl_s > 0 and not body.debug:
            versions = {**self.versions(), **({"variant": f"{arm.experiment}:{arm.variant}"} if arm else {})}
            cache_key = result_cache_key(body.user_id, body.k, body.context, history_version, versions, route.llm)
            cached, degraded = self._cached(cache_key)
            if cached is not None:
                answer = {**cached, "request_id": request_id or uuid.uuid4().hex, "path": "cache",
                          "degraded": False, "total_ms": round((time.perf_counter() - t0) * 1000, 3)}
                self.metrics.observe_answer("cache", time.perf_counter() - t0, [])
                return self._log_impressions(answer, arm)
        request = self.catalog.request_for(
            body.user_id, body.k, context=body.context, debug=body.debug,
            request_id=request_id or uuid.uuid4().hex, online_history=history, deadline=deadline,
        )
        pipeline = self.pipeline
        if arm is not None:
            request = dataclasses.replace(request, variant=arm.variant)
            pipeline = self.variant_pipelines.get(arm.variant, pipeline)
        handoffs: list[dict[str, Any]] = []
        observe = stage_handoffs(pipeline, self.catalog, handoffs) if request.debug else None
        result = pipeline.run(request, skip=() if route.llm else self.llm_stages, observe=observe)
        answer = build_response(request, result, self.catalog, self.llm_stages, t0)
        if request.debug:
            answer["debug"]["handoffs"] = handoffs
        answer["versions"].update(self.extra_versions())
        answer["route"], answer["degraded"] = route.reason, degraded
        answer["experiment"], answer["variant"] = (arm.experiment, arm.variant) if arm else (None, None)
        if cache_key is not None and answer["path"] != "fallback":  # never pin a degraded answer
            self._store(cache_key, answer)
        answer["total_ms"] = round((time.perf_counter() - t0) * 1000, 3)
        self.metrics.observe_answer(answer["path"], time.perf_counter() - t0, result.traces)
        if degraded:
            self.metrics.degraded.inc()
        return self._log_impressions(answer, arm)

    def _log_impressions(self, answer: dict[str, Any], arm: Assignment | None) -> dict[str, Any]:
        """Record the items shown to an experiment's user on the events stream (best effort)."""
        answer["impressions_logged"] = False
        if arm is None or self.online is None or answer["degraded"] or not answer["items"]:
            return answer
        ts = f"{time.time():.3f}"
        entries = [{"user_id": answer["user_id"], "item_id": item["id"], "type": "impression", "ts": ts,
                    "experiment": arm.experiment, "variant": arm.variant, "request_id": answer["request_id"],
                    "rank": str(item["rank"])} for item in answer["items"]]
        try:
            self.online.log_impressions(entries)
        except RedisUnavailable:
            self.metrics.redis_errors.inc()
            return answer
        answer["impressions_logged"] = True
        return answer

    def _online_history(self, user_id: str) -> tuple[np.ndarray | None, int, bool]:
        """(online history or None for the split's, history version, degraded)."""
        if self.online is None:
            return None, 0, False
        try:
            history, version = self.online.history(user_id, self.catalog.user_index.get(user_id))
        except RedisUnavailable as exc:
            self.metrics.redis_errors.inc()
            log.debug("history of %s from the split: %s", user_id, exc)
            return None, 0, True
        return history, version, False

    def _cached(self, key: str) -> tuple[dict[str, Any] | None, bool]:
        if self.online is None:
            return None, False
        try:
            hit = self.online.cached_result(key)
        except RedisUnavailable:
            self.metrics.redis_errors.inc()
            return None, True
        self.metrics.cache.labels("hit" if hit is not None else "miss").inc()
        return hit, False

    def _store(self, key: str, answer: dict[str, Any]) -> None:
        if self.online is None:
            return
        keep = {k: v for k, v in answer.items() if k not in ("request_id", "total_ms")}
        try:
            self.online.store_result(key, keep, self.settings.serving.result_cache_ttl_s)
        except RedisUnavailable:
            self.metrics.redis_errors.inc()


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


def answer_path(traces: list[StageTrace], llm_stages: frozenset[str]) -> str:
    """"llm" when an LLM stage ran, else "fallback" when any stage fell back, else "light"."""
    if any(t.name in llm_stages and t.status == "ok" for t in traces):
        return "llm"
    if any(t.status == "fallback" for t in traces):
        return "fallback"
    return "light"


def build_response(
    request: Request, result: PipelineResult, catalog: CatalogState, llm_stages: frozenset[str], t0: float
) -> dict[str, Any]:
    """The JSON dict of ``serving.schemas.RecommendResponse``; ``t0`` is the perf_counter at arrival."""
    cands = result.candidates
    order = cands.score(cands.order_by) if cands.order_by else None
    backfill = cands.flags.get("backfill", np.zeros(len(cands), dtype=bool))
    items = [
        {
            "id": catalog.item_id(int(item)),
            "title": catalog.title(int(item)),
            "score": None if order is None else _finite(order[i]),
            "rank": i + 1,
            "disclaimers": list(cands.disclaimers.get(int(item), [])),
            "backfill": bool(backfill[i]),
        }
        for i, item in enumerate(cands.items)
    ]
    out: dict[str, Any] = {
        "request_id": request.request_id,
        "user_id": request.user_id,
        "cold_start": request.user_idx is None,
        "items": items,
        "stages": [
            {"name": t.name, "status": t.status, "ms": round(t.ms, 3), "n_in": t.n_in, "n_out": t.n_out, "reason": t.reason}
            for t in result.traces
        ],
        "versions": dict(result.versions),
        "fallbacks": result.fallbacks,
        "path": answer_path(result.traces, llm_stages),
        "complete": result.complete,
        "short_by": result.short_by,
        "short_reason": result.short_reason or None,
    }
    if request.debug:
        out["debug"] = _debug_block(request, cands, catalog)
    out["total_ms"] = round((time.perf_counter() - t0) * 1000, 3)
    return out


HANDOFF_ITEMS = 200  # items shown per stage in a debug answer (recall's whole depth by default)


def stage_handoffs(pipeline: Pipeline, catalog: CatalogState, out: list[dict[str, Any]]) -> Callable[[str, Candidates], None]:
    """A ``Pipeline.run`` observer filling ``out`` with what each stage handed on (debug answers):
    its items in order, its own score, the channels that found each item, and fusion's weights."""
    kinds = {spec.name: (spec.kind, stage) for spec, stage in pipeline.stages}

    def observe(name: str, cands: Candidates) -> None:
        kind, stage = kinds.get(name, ("", None))
        head = cands.head(HANDOFF_ITEMS)
        own = head.scores.get(name)
        channels = {k.removeprefix("src_"): v for k, v in head.flags.items() if k.startswith("src_")}
        entry: dict[str, Any] = {"stage": name, "n": len(cands), "order_by": cands.order_by, "items": [
            {"id": catalog.item_id(int(item)), "score": None if own is None else _finite(own[i]),
             "channels": [c for c, found in channels.items() if found[i]]}
            for i, item in enumerate(head.items)]}
        weights_for = getattr(stage, "weights_for", None) if kind == "fusion" else None
        if weights_for is not None:
            entry["fusion_weights"] = weights_for(cands)
        out.append(entry)

    return observe


def _debug_block(request: Request, cands: Candidates, catalog: CatalogState) -> dict[str, Any]:
    return {
        "order_by": cands.order_by,
        "history_len": len(request.history),
        "removed": [{"id": catalog.item_id(int(i)), "reason": reason} for i, reason in cands.removed],
        "item_scores": {
            catalog.item_id(int(item)): {name: _finite(col[row]) for name, col in cands.scores.items()}
            for row, item in enumerate(cands.items)
        },
    }


def _finite(value: Any) -> float | None:
    """JSON has no NaN: an unscored item gets null."""
    v = float(value)
    return v if math.isfinite(v) else None


class ServiceSlot:
    """Where the app keeps its ``Recommender``: empty while artifacts load, or the load error.

    Written once by the start-up task, read by every request (readiness and the routes).
    """

    def __init__(self, recommender: Recommender | None = None):
        self.recommender = recommender
        self.error: str | None = None

    @property
    def status(self) -> str:
        if self.recommender is not None:
            return "ready"
        return "failed" if self.error is not None else "loading"

    def describe(self) -> str:
        if self.status == "failed":
            return f"service not ready: loading artifacts failed: {self.error}"
        return f"service {self.status}" if self.status == "ready" else "service not ready: loading artifacts"
