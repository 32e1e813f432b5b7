"""One pipeline run as the API's typed answer, ``serving.schemas.RecommendResponse``.

``build_response`` turns a ``PipelineResult`` and how the request was served (``Served``: the
policy's route, Redis health, the experiment arm, debug hand-offs) into the response model in
one go. ``serving.service`` only stamps the two facts known at the very end (``total_ms``,
``impressions_logged``) on a copy. ``stage_handoffs`` records what each stage handed on, for
debug answers.

JSON has no NaN: a score that is not finite (an item a stage did not score) is served as
null, so no model output can make an answer unserialisable.

Deliberately left out: the traffic policy, the result cache and Redis (``serving.service``),
HTTP (``serving.routes``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recsys.contract import Candidates, Request, StageTrace, WeightsLookup
from recsys.experiments import Assignment
from recsys.pipeline import Pipeline, PipelineResult
from serving.catalog_state import CatalogState
from serving.policy import RouteReason
from serving.schemas import (
    AnswerPath,
    DebugInfo,
    HandoffItem,
    RecommendedItem,
    RecommendResponse,
    RemovedItem,
    StageHandoff,
    StageInfo,
)

HANDOFF_ITEMS = 200  # items shown per stage in a debug answer (recall's whole depth by default)


@dataclass(frozen=True)
class Served:
    """How one request was served, beside what the pipeline returned."""

    route: RouteReason
    degraded: bool = False  # Redis was down: split history, no cache
    arm: Assignment | None = None  # the user's experiment arm, when an experiment is active
    extra_versions: Mapping[str, str] = field(default_factory=dict)  # e.g. the active prompt version
    handoffs: Sequence[StageHandoff] = ()  # debug answers: what each stage handed on


def answer_path(traces: list[StageTrace], llm_stages: frozenset[str]) -> AnswerPath:
    """"llm" when an LLM stage ran, else "fallback" when any stage fell back, else "light"."""
    if any(t.name in llm_stages and t.status == "ok" for t in traces):
        return "llm"
    if any(t.status == "fallback" for t in traces):
        return "fallback"
    return "light"


def build_response(request: Request, result: PipelineResult, catalog: CatalogState, llm_stages: frozenset[str],
                   served: Served, t0: float) -> RecommendResponse:
    """The answer to ``request``; ``t0`` is the perf_counter at arrival (``total_ms`` so far).

    ``debug`` is set only for a debug request, so it is absent from the JSON otherwise.
    """
    cands = result.candidates
    order = cands.score(cands.order_by) if cands.order_by else None
    backfill = cands.flags.get("backfill", np.zeros(len(cands), dtype=bool))
    items = [
        RecommendedItem(id=catalog.item_id(int(item)), title=catalog.title(int(item)),
                        score=None if order is None else _finite(order[i]), rank=i + 1,
                        disclaimers=[str(d) for d in cands.disclaimers.get(int(item), [])],
                        backfill=bool(backfill[i]))
        for i, item in enumerate(cands.items)
    ]
    stages = [StageInfo(name=t.name, status=t.status, ms=round(float(t.ms), 3), n_in=int(t.n_in),
                        n_out=int(t.n_out), reason=t.reason) for t in result.traces]
    arm = served.arm
    debug = {"debug": _debug_block(request, cands, catalog, served.handoffs)} if request.debug else {}
    return RecommendResponse(
        request_id=request.request_id, user_id=request.user_id, cold_start=not len(request.history),
        items=items, stages=stages, versions={**result.versions, **served.extra_versions},
        fallbacks=list(result.fallbacks), path=answer_path(result.traces, llm_stages),
        complete=result.complete, short_by=result.short_by, short_reason=result.short_reason or None,
        route=served.route, degraded=served.degraded, total_ms=round((time.perf_counter() - t0) * 1000, 3),
        experiment=arm.experiment if arm else None, variant=arm.variant if arm else None,
        impressions_logged=False, **debug,
    )


def stage_handoffs(pipeline: Pipeline, catalog: CatalogState,
                   out: list[StageHandoff]) -> Callable[[str, Candidates], None]:
    """A ``Pipeline.run`` observer filling ``out`` with what each stage handed on (debug answers):
    its items in order, its own score, the channels that found each item, and fusion's weights."""
    stages = {spec.name: stage for spec, stage in pipeline.stages}

    def observe(name: str, cands: Candidates) -> None:
        stage = stages.get(name)
        head = cands.head(HANDOFF_ITEMS)
        own = head.scores.get(name)
        channels = {k.removeprefix("src_"): v for k, v in head.flags.items() if k.startswith("src_")}
        items = [HandoffItem(id=catalog.item_id(int(item)), score=None if own is None else _finite(own[i]),
                             channels=[c for c, found in channels.items() if found[i]])
                 for i, item in enumerate(head.items)]
        # fusion_weights is set only for a fusion stage, so it is absent from the JSON otherwise
        weights: dict[str, dict[str, float]] = {} if not isinstance(stage, WeightsLookup) else {
            "fusion_weights": {str(k): float(w) for k, w in stage.weights_for(cands).items()}}
        out.append(StageHandoff(stage=name, n=len(cands), order_by=cands.order_by, items=items, **weights))

    return observe


def _debug_block(request: Request, cands: Candidates, catalog: CatalogState,
                 handoffs: Sequence[StageHandoff]) -> DebugInfo:
    return DebugInfo(
        order_by=cands.order_by,
        history_len=len(request.history),
        removed=[RemovedItem(id=catalog.item_id(int(i)), reason=reason) for i, reason in cands.removed],
        item_scores={
            catalog.item_id(int(item)): {name: _finite(col[row]) for name, col in cands.scores.items()}
            for row, item in enumerate(cands.items)
        },
        handoffs=list(handoffs),
    )


def _finite(value: Any) -> float | None:
    """JSON has no NaN: an unscored item gets null."""
    v = float(value)
    return v if math.isfinite(v) else None
