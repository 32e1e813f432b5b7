"""The FastAPI app factory: wires routers, middleware, error handlers, artifacts and Redis.

Nothing is created at import time; ``create_app(settings, artifact_dir)`` builds a fresh app
(tests build their own). The lifespan opens the worker's ``OnlineBackend`` (Redis, starting
an embedded server when none is configured), then loads artifacts in a background task, so
``/healthz`` answers at once and ``/readyz`` turns from 503 to 200 when loading finishes
(or stays 503 with the error when it fails). Passing ``pipeline`` loads eagerly instead:
the catalog is read in the factory and the app is ready before it serves.

A ``PipelineError`` (a stage configured ``on_error: fail``, such as the compliance rules,
failed) becomes 503 naming the stage: the service refuses rather than answer unsafely. Any
other exception is a 500 counted in ``recsys_errors_total{kind="internal"}``; bodies refused
by ``JsonBodyCheck`` are counted there too, by kind. ``/docs`` and ``/redoc`` serve their
JavaScript and CSS from the pinned ``fastapi-offline`` wheel, so they work without internet.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.to_thread
from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline

from cascade.settings import Settings
from recsys.manifest import damaged_file
from recsys.pipeline import Pipeline, PipelineError
from serving import console
from serving.catalog_state import CatalogState
from serving.metrics import ServingMetrics
from serving.middleware import BodySizeLimit, JsonBodyCheck, RequestContext
from serving.online_backend import OnlineBackend
from serving.rate_limit import EventRateLimit
from serving.routes import admin, events, health, recommend
from serving.service import Recommender, ServiceSlot

log = logging.getLogger(__name__)


def create_app(settings: Settings, artifact_dir: Path, *, pipeline: Pipeline | None = None) -> FastAPI:
    """A new app serving ``artifact_dir`` (the per-dataset root holding ``split/`` etc.)."""
    artifact_dir = Path(artifact_dir)
    metrics = ServingMetrics()
    # loading eagerly (a given pipeline): an unreadable catalog fails here, as before any request
    catalog = CatalogState.load(artifact_dir) if pipeline is not None else None
    slot = ServiceSlot()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        backend = await anyio.to_thread.run_sync(OnlineBackend.open, settings, artifact_dir)
        app.state.backend = backend
        try:
            async with anyio.create_task_group() as tg:
                if pipeline is not None and catalog is not None:
                    slot.recommender = await anyio.to_thread.run_sync(functools.partial(
                        Recommender.build, settings, catalog, pipeline, metrics, artifact_dir, backend,
                        preload=settings.llm.explain.preload))
                else:
                    tg.start_soon(_load_into, slot, settings, artifact_dir, backend, metrics)
                yield
                tg.cancel_scope.cancel()  # shutting down: abandon a load still in progress
        finally:
            await anyio.to_thread.run_sync(backend.close)

    app = FastAPIOffline(
        title="Hybrid recommender",
        summary="Two-tower recall -> LightGBM coarse ranking -> LLM re-ranking -> rules -> fusion.",
        version="0.2.0",
        lifespan=lifespan,
        swagger_ui_parameters={"validatorUrl": None},  # no badge fetched from the public validator
    )
    app.state.settings = settings
    app.state.slot = slot
    app.state.metrics = metrics
    app.state.artifact_dir = artifact_dir
    for module in (health, recommend, events, admin, console):
        app.include_router(module.router)
    app.mount(console.STATIC_PATH, console.static_files(), name="console-static")
    app.add_exception_handler(PipelineError, _pipeline_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _internal_error)
    app.add_middleware(JsonBodyCheck, max_depth=settings.serving.max_json_depth,  # inside the size limit
                       on_refused=lambda kind: metrics.errors.labels(kind).inc())
    app.add_middleware(EventRateLimit, rate_per_s=settings.serving.events_rate_per_s,  # before any body is read
                       burst=settings.serving.events_rate_burst, client_header=settings.serving.rate_limit_client_header,
                       on_limited=lambda: metrics.errors.labels("rate_limited").inc())
    app.add_middleware(BodySizeLimit, max_bytes=settings.serving.max_body_bytes)
    app.add_middleware(RequestContext)  # outermost: even a 413 carries a request id
    return app


async def _load_into(
    slot: ServiceSlot, settings: Settings, artifact_dir: Path, backend: OnlineBackend, metrics: ServingMetrics
) -> None:
    """Load artifacts on a worker thread; record the error instead of killing the process."""

    try:
        slot.recommender = await anyio.to_thread.run_sync(Recommender.load, settings, artifact_dir, None, metrics,
                                                          backend, abandon_on_cancel=True)
        log.info("artifacts loaded from %s", artifact_dir)
    except Exception as exc:  # readiness reports it; liveness stays up so the error can be read
        # a refused file is fully said by its line; anything else keeps its traceback in the log
        damaged = damaged_file(exc)
        log.error("loading artifacts from %s failed: %s: %s", artifact_dir, type(exc).__name__, exc,
                  exc_info=None if damaged is not None else exc)
        slot.failed(exc, damaged)


async def _pipeline_error(request: HttpRequest, exc: PipelineError) -> JSONResponse:
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is not None:
        metrics.errors.labels(f"stage_{exc.stage}").inc()
    return JSONResponse({"detail": str(exc), "stage": exc.stage}, status_code=503)


async def _validation_error(request: HttpRequest, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422, written even when an error echoes a non-finite number (JSON has none).

    ``JsonBodyCheck`` refuses NaN/Infinity in JSON bodies first; this keeps any other way in
    (a future route, a float parameter) a 422 rather than a failure to write the 422 (500).
    """
    return JSONResponse({"detail": _finite(jsonable_encoder(exc.errors()))}, status_code=422)


def _finite(value: object) -> object:
    """``value`` with every NaN/infinity replaced by its JSON-ish spelling ("NaN", "Infinity")."""
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


async def _internal_error(request: HttpRequest, exc: Exception) -> JSONResponse:
    """A bug answered as a counted 500 (the server still logs the traceback)."""
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is not None:
        metrics.errors.labels("internal").inc()
    return JSONResponse({"detail": "internal server error"}, status_code=500)
