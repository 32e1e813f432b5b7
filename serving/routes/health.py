"""Liveness and readiness probes.

``/healthz`` answers 200 whenever the process serves HTTP (liveness: restart me if not);
``/readyz`` answers 200 only once artifacts are loaded (readiness: route traffic to me),
503 while loading or after a failed load, with the reason (and ``damaged_file``, the artifact
whose digest was refused, when that was it; ``POST /admin/reload`` makes the worker ready once the
files are fixed; while serving, ``reload_refused`` says why the last ``POST /admin/reload`` was refused,
``damaged_file`` included, until one succeeds). ``/metrics`` is the Prometheus
exposition (all workers aggregated in multi-process mode, see ``serving.metrics``); readiness
also says whether Redis answers (a down Redis degrades, it does not make the worker unready)
and, when this process supervises the embedded Redis, how often it was restarted,
and lists in ``degraded_stages`` each configured, enabled stage that failed to load (an LLM
stage: the worker serves the light path without it), with the reason. That too stays 200:
see ``serving.stage_loading`` for why.
"""

from __future__ import annotations

import dataclasses
import os

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from serving.deps import MetricsDep, SettingsDep, SlotDep
from serving.metrics import CONTENT_TYPE
from serving.stage_loading import degraded_stages

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "alive"}


@router.get("/readyz", responses={503: {"description": "Artifacts are loading or failed to load."}})
async def readyz(request: Request, slot: SlotDep, settings: SettingsDep) -> JSONResponse:
    if slot.recommender is None:
        return JSONResponse({"status": slot.status, "detail": slot.describe(), "damaged_file": slot.damaged_file},
                            status_code=503)
    backend = getattr(request.app.state, "backend", None)
    redis_ok = backend is not None and not backend.guard.down
    degraded = [dataclasses.asdict(d) for d in degraded_stages(settings, slot.recommender.pipeline)]
    supervisor = backend.supervisor if backend is not None else None  # this process's embedded Redis, if any
    return JSONResponse({"status": "ready", "versions": slot.recommender.versions(), "redis": redis_ok,
                         "redis_restarts": supervisor.restarts if supervisor is not None else None,
                         "degraded_stages": degraded, "reload_refused": slot.reload_refused, "pid": os.getpid()})


@router.get("/metrics")
async def metrics(m: MetricsDep) -> Response:
    return Response(m.render(), media_type=CONTENT_TYPE)
