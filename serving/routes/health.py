"""Liveness and readiness probes.

``/healthz`` answers 200 whenever the process serves HTTP (liveness: restart me if not);
``/readyz`` answers 200 only once artifacts are loaded (readiness: route traffic to me),
503 while loading or after a failed load, with the reason.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from serving.deps import SlotDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "alive"}


@router.get("/readyz", responses={503: {"description": "Artifacts are loading or failed to load."}})
async def readyz(slot: SlotDep) -> JSONResponse:
    if slot.recommender is None:
        return JSONResponse({"status": slot.status, "detail": slot.describe()}, status_code=503)
    return JSONResponse({"status": "ready", "versions": slot.recommender.pipeline.versions()})
