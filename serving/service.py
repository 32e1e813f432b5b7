"""Answers one recommendation request as the API's JSON: the code HTTP and the CLI share.

``Recommender`` holds the loaded ``CatalogState`` and ``Pipeline``; ``recommend`` turns an
external user id into a ``Request``, runs the pipeline (synchronously: the HTTP layer calls
it from a worker thread) and builds the response dict with ``build_response``. The route
and ``serving.run.recommend_once`` both return exactly that dict, so the CLI prints what
the server would send.

Deliberately left out: HTTP status codes and threads (``serving.app``), process start-up
(``serving.run``). A ``PipelineError`` (a fail-closed stage failed) propagates to the caller.
"""

from __future__ import annotations

import math
import time
import uuid
from pathlib import Path
from typing import Any

from recsys.contract import Candidates, Request, StageTrace
from recsys.pipeline import Pipeline, PipelineResult
from recsys.settings import Settings
from serving.schemas import RecommendRequest
from serving.state import CatalogState


class Recommender:
    """Loaded state plus pipeline; built once per process by the app's start-up or the CLI."""

    def __init__(self, settings: Settings, catalog: CatalogState, pipeline: Pipeline):
        self.settings = settings
        self.catalog = catalog
        self.pipeline = pipeline
        self.llm_stages = frozenset(spec.name for spec, _ in pipeline.stages if spec.kind == "llm")

    @classmethod
    def load(cls, settings: Settings, artifact_dir: Path, pipeline: Pipeline | None = None) -> Recommender:
        """Read the catalog from ``artifact_dir/split``; build and load the pipeline unless given."""
        catalog = CatalogState.load(artifact_dir)
        if pipeline is None:
            from recsys.registry import build_pipeline  # imports the configured stage packages

            pipeline = build_pipeline(settings, Path(artifact_dir))
        return cls(settings, catalog, pipeline)

    def recommend(self, body: RecommendRequest, request_id: str | None = None) -> dict[str, Any]:
        """The API answer for ``body`` (limits are the caller's to check first)."""
        t0 = time.perf_counter()
        request = self.catalog.request_for(
            body.user_id, body.k, context=body.context, debug=body.debug, request_id=request_id or uuid.uuid4().hex
        )
        result = self.pipeline.run(request)
        return build_response(request, result, self.catalog, self.llm_stages, t0)


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
    items = [
        {
            "id": catalog.item_id(int(item)),
            "title": catalog.title(int(item)),
            "score": None if order is None else _finite(order[i]),
            "rank": i + 1,
            "disclaimers": list(cands.disclaimers.get(int(item), [])),
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
    }
    if request.debug:
        out["debug"] = _debug_block(request, cands, catalog)
    out["total_ms"] = round((time.perf_counter() - t0) * 1000, 3)
    return out


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
