"""Small read-only JSON routes the console needs and the API lacks, under ``/console/api``.

- ``GET /console/api/health`` (public): readiness, Redis state and versions as ``/readyz``
  reports them, plus ``serving.console.summary`` of ``/metrics`` over the last five minutes;
- ``GET /console/api/{kind}/versions/{version}`` (admin): a published rule set or prompt
  document, as YAML, for the Rules & prompts page;
- ``GET /console/api/{kind}/diff?base=&head=`` (admin): the line diff of two published versions;
- ``GET /console/api/experiments`` and ``.../experiments/plots/{name}`` (admin): the configured
  experiment (no salt) and the latest stored analysis with its plots (``serving.console.experiments``).

Admin routes take ``X-API-Key`` through ``serving.deps.AdminDep``, as ``/admin`` does: what
they show (stored documents, shares, analyses) is not public in the API either. Nothing here
writes: publishing and rollback go through ``/admin``.
"""

from __future__ import annotations

import difflib
import json
from typing import Any, Literal

import yaml
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse

from recsys.redis_client import RedisUnavailable
from serving.console.experiments import experiment_view, latest_analysis, plot_path
from serving.console.summary import MetricsWindow, window_summary
from serving.deps import AdminDep, BackendDep, MetricsDep, SettingsDep, SlotDep
from serving.online_backend import OnlineBackend

router = APIRouter(prefix="/console/api", tags=["console"])
Kind = Literal["rules", "prompts"]
HEALTH_WINDOW_S = 300.0
_ADMIN_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "Missing or wrong X-API-Key."}, 503: {"description": "Admin disabled or Redis down."},
}


def _window(request: Request) -> MetricsWindow:
    window = getattr(request.app.state, "console_metrics_window", None)
    if window is None:
        window = request.app.state.console_metrics_window = MetricsWindow(HEALTH_WINDOW_S)
    return window


@router.get("/health")
async def health(request: Request, slot: SlotDep, metrics: MetricsDep) -> dict[str, Any]:
    backend = getattr(request.app.state, "backend", None)
    recommender = slot.recommender
    text = (await run_in_threadpool(metrics.render)).decode()
    return {
        "ready": recommender is not None, "status": slot.status,
        "detail": None if recommender is not None else slot.describe(),
        "redis": None if backend is None else not backend.guard.down,
        "versions": recommender.versions() if recommender is not None else {},
        "metrics": window_summary(_window(request), text),
    }


def as_yaml(document: str) -> str:
    """A stored canonical-JSON document as block YAML, keys sorted (one key per line: diffs read well)."""
    return yaml.safe_dump(json.loads(document), sort_keys=True, allow_unicode=True, default_flow_style=False,
                          width=10_000)  # no folding: a changed word changes one line


def _document(backend: OnlineBackend, kind: Kind, version: str) -> str:
    try:
        document = backend.versions.document(kind, version)
    except RedisUnavailable as exc:
        raise HTTPException(status_code=503, detail=str(exc)) from None
    if document is None:
        raise HTTPException(status_code=404, detail=f"{kind} version {version!r} was never published")
    return as_yaml(document)


def line_diff(base: str, head: str) -> list[list[str]]:
    """``[[op, line], ...]`` with op ``" "`` (both), ``"-"`` (base only) or ``"+"`` (head only).

    >>> line_diff("a\\nb\\n", "a\\nc\\n")
    [[' ', 'a'], ['-', 'b'], ['+', 'c']]
    """
    out = []
    for line in difflib.ndiff(base.splitlines(), head.splitlines()):
        if line[:1] in (" ", "-", "+"):
            out.append([line[0], line[2:]])
    return out


@router.get("/{kind}/versions/{version:path}", dependencies=[AdminDep],
            responses={**_ADMIN_ERRORS, 404: {"description": "Unknown version."}})
async def version_document(kind: Kind, version: str, backend: BackendDep) -> dict[str, str]:
    text = await run_in_threadpool(_document, backend, kind, version)
    return {"kind": kind, "version": version, "document": text}


@router.get("/{kind}/diff", dependencies=[AdminDep], responses={**_ADMIN_ERRORS, 404: {"description": "Unknown version."}})
async def version_diff(kind: Kind, backend: BackendDep, base: str = Query(min_length=1, max_length=128),
                       head: str = Query(min_length=1, max_length=128)) -> dict[str, Any]:
    a = await run_in_threadpool(_document, backend, kind, base)
    b = await run_in_threadpool(_document, backend, kind, head)
    return {"kind": kind, "base": base, "head": head, "lines": line_diff(a, b)}


@router.get("/experiments", dependencies=[AdminDep], responses=_ADMIN_ERRORS)
async def experiments(request: Request, settings: SettingsDep) -> dict[str, Any]:
    analysis = await run_in_threadpool(latest_analysis, request.app.state.artifact_dir)
    return {"config": experiment_view(settings.experiments), "analysis": analysis,
            "analyses_dir": "ab/ under the served artifact directory"}


@router.get("/experiments/plots/{name}", dependencies=[AdminDep], response_class=FileResponse,
            responses={**_ADMIN_ERRORS, 404: {"description": "No such plot beside the latest analysis."}})
async def experiment_plot(request: Request, name: str) -> FileResponse:
    path = await run_in_threadpool(plot_path, request.app.state.artifact_dir, name)
    if path is None or not path.is_file():
        raise HTTPException(status_code=404, detail=f"no plot {name!r} beside the latest analysis")
    return FileResponse(path, media_type="image/png")
