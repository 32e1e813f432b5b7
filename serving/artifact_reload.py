"""Swapping in new artifacts while serving: build, check, then replace the ``Recommender`` at once.

``POST /admin/reload`` (``serving.routes.admin``) calls ``load_checked`` on a worker thread,
off the request path, while the current ``Recommender`` keeps answering. The new one is
accepted only when

- the catalog (``split/``) reads back,
- every file each stage reads matches the digest recorded at training (``recsys.manifest``,
  checked before any native library parses it: a torn LightGBM model would abort the process),
- every *enabled* stage loads (unlike start-up, where an LLM stage that fails to load is
  disabled: a reload that would silently lose a stage is refused instead), and
- a smoke request (the first known user, served from the split's histories, no Redis)
  runs without a fail-closed stage failing and without any stage falling back on an
  error (a fallback on its time budget is fine: the machine may be busy).

``swap`` then builds the served recommender from the checked catalog and pipeline on the
worker's online state (``Recommender.build`` with ``OnlineBackend.link``: the active rules/prompt
versions are installed before it serves) and replaces the slot's reference in one assignment,
so requests in flight finish on the old pipeline and the next ones use the new. Anything refused raises ``ReloadRefused`` naming what was wrong; nothing is swapped.

Deliberately left out: watching the artifact directory (an operator or the training job
calls the route), reloading every worker of a multi-worker server (call each, or restart).
"""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import ValidationError
from redis import Redis

from cascade.registry import StaleArtifacts, build_pipeline, check_trained_on_split
from cascade.settings import Settings
from recsys.pipeline import Pipeline, PipelineError
from serving.catalog_state import CatalogState
from serving.metrics import ServingMetrics
from serving.online_backend import OnlineBackend
from serving.schemas import RecommendRequest, RecommendResponse
from serving.service import Recommender, ServiceSlot
from serving.stage_loading import load_failure

log = logging.getLogger(__name__)
_BUDGET_REASONS = ("budget overrun", "deadline")


class ReloadRefused(ValueError):
    """The new artifacts cannot serve; the message says which part and why."""


def load_checked(settings: Settings, artifact_dir: Path, metrics: ServingMetrics | None = None,
                 redis: Redis | None = None) -> Recommender:
    """A new, fully loaded and smoke-tested ``Recommender`` for ``artifact_dir``, else ``ReloadRefused``;
    offline (``swap`` serves it online). ``redis`` is the worker's client, for the LLM stage's KV cache."""

    artifact_dir = Path(artifact_dir)
    try:
        catalog = CatalogState.load(artifact_dir)
    except Exception as exc:
        raise ReloadRefused(f"{artifact_dir / 'split'}: catalog unreadable: {type(exc).__name__}: {exc}") from exc
    try:
        built = build_pipeline(settings, artifact_dir, load=False, redis=redis)
    except Exception as exc:
        raise ReloadRefused(f"pipeline cannot be built: {type(exc).__name__}: {exc}") from exc
    try:
        check_trained_on_split(built, artifact_dir)
    except StaleArtifacts as exc:
        raise ReloadRefused(str(exc)) from exc
    except Exception as exc:  # the split's own files unreadable
        raise ReloadRefused(f"{artifact_dir}: cannot tell which split the stages were trained on: "
                            f"{type(exc).__name__}: {exc}") from exc
    for spec, stage in built.stages:
        if not spec.enabled:
            continue
        try:
            stage.load(artifact_dir)
        except Exception as exc:
            raise ReloadRefused(load_failure(spec.name, artifact_dir, exc)) from exc
    recommender = Recommender(settings, catalog, Pipeline(built.stages, built.request_budget_ms), metrics,
                              Path(artifact_dir))
    smoke_test(recommender)
    return recommender


COLD_SMOKE_USER = "reload-smoke-cold-user"


def smoke_test(recommender: Recommender) -> RecommendResponse:
    """One answer for the first known user (else a cold start); ``ReloadRefused`` if it is unsafe."""
    k = min(10, recommender.settings.pipeline.max_k)
    user = next(iter(recommender.catalog.user_index), COLD_SMOKE_USER)
    try:
        body = RecommendRequest(user_id=user, k=k)
    except ValidationError:  # an id no request can name (a split saved before ids were bounded): a cold start
        user, body = COLD_SMOKE_USER, RecommendRequest(user_id=COLD_SMOKE_USER, k=k)
    try:
        answer = recommender.respond(body, request_id="reload-smoke")
    except PipelineError as exc:
        raise ReloadRefused(f"smoke request for user {user!r} failed: {exc}") from exc
    except Exception as exc:
        raise ReloadRefused(f"smoke request for user {user!r} raised {type(exc).__name__}: {exc}") from exc
    broken = [f"{s.name}: {s.reason}" for s in answer.stages
              if s.status == "fallback" and not any(r in s.reason for r in _BUDGET_REASONS)]
    if broken:
        raise ReloadRefused(f"smoke request for user {user!r}: stage(s) fell back on errors: {'; '.join(broken)}")
    return answer


def swap(slot: ServiceSlot, backend: OnlineBackend, checked: Recommender) -> Recommender:
    """Serve ``checked``'s catalog and pipeline on the online state; returns the recommender now served."""
    new = Recommender.build(checked.settings, checked.catalog, checked.pipeline, checked.metrics,
                            checked.artifact_dir, backend)
    slot.serve(new)  # one reference assignment: in-flight requests keep the old object
    log.info("artifacts reloaded: now serving %s", new.versions())
    return new
