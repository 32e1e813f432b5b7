"""FastAPI dependencies of the routes, as ``Annotated`` aliases (one place, short routes).

Everything comes from ``app.state`` set by ``serving.app.create_app``: the ``Settings``, the
``ServiceSlot`` holding the loaded ``Recommender``, the ``ServingMetrics`` and the worker's
``OnlineBackend``. ``admin_key`` guards the admin routes: no key configured -> 503 (admin
disabled), missing or wrong ``X-API-Key`` -> 401; the comparison is constant-time and the key
is never logged. The key is read through ``fastapi.security.APIKeyHeader``, so OpenAPI declares
the ``APIKey`` security scheme and ``/docs`` has an "Authorize" button for it.

``RecommendCallDep`` is everything ``POST /v1/recommend`` needs, solved as one dependency (FastAPI
solves each dependency node anew per request, at tens of microseconds a node on this hot route):
the body within the configured limits (422), shown a key when it asks for ``debug: true`` (the
admin key or ``serving.debug_api_key`` in ``X-API-Key``, else 403 naming what is missing), the
loaded recommender (503 while loading), the request id and the ``X-Recsys-Origin`` header. Debug
answers skip the result cache, weigh ~40 times a plain one and show which gate removed which
item for a user (their age band, their risk tolerance): not for anyone who knows a user id.
The dependencies are ``async def``
although none awaits: FastAPI runs a plain ``def`` dependency on the threadpool, one thread
hop each per request, for work that takes microseconds.
"""

from __future__ import annotations

import hmac
import re
import uuid
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.security import APIKeyHeader
from pydantic import SecretStr

from cascade.settings import Settings
from serving.metrics import ServingMetrics
from serving.online_backend import OnlineBackend
from serving.schemas import LimitError, RecommendRequest, within_limits
from serving.service import Recommender, ServiceSlot

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_slot(request: Request) -> ServiceSlot:
    return request.app.state.slot


SettingsDep = Annotated[Settings, Depends(get_settings)]
SlotDep = Annotated[ServiceSlot, Depends(get_slot)]


async def get_recommender(slot: SlotDep) -> Recommender:
    """The loaded recommender, or 503 while artifacts are loading (or failed to load)."""
    return loaded_recommender(slot)


def loaded_recommender(slot: ServiceSlot) -> Recommender:
    if slot.recommender is None:
        raise HTTPException(status_code=503, detail=slot.describe())
    return slot.recommender


def checked_body(body: RecommendRequest, settings: Settings) -> RecommendRequest:
    """The request body within the configured limits (k <= pipeline.max_k, context size), else 422."""
    try:
        return within_limits(body, settings)
    except LimitError as exc:
        raise RequestValidationError(exc.errors, body=body.model_dump()) from None


def request_id(request: Request, x_request_id: str | None) -> str:
    """The id ``RequestContext`` chose (the caller's sane X-Request-ID or a fresh one)."""
    chosen = getattr(request.state, "request_id", None)
    if chosen:
        return str(chosen)
    if x_request_id is not None and _REQUEST_ID.fullmatch(x_request_id):
        return x_request_id
    return uuid.uuid4().hex


async def get_metrics(request: Request) -> ServingMetrics:
    return request.app.state.metrics


async def get_backend(request: Request) -> OnlineBackend:
    backend = getattr(request.app.state, "backend", None)
    if backend is None:
        raise HTTPException(status_code=503, detail="online state not started")
    return backend


ADMIN_KEY_HEADER = APIKeyHeader(
    name="X-API-Key", scheme_name="APIKey", auto_error=False,  # admin_key answers 401/503 itself
    description="The admin key: `serving.admin_api_key` in the config file or the environment variable "
                "RECSYS_SERVING__ADMIN_API_KEY. Without one the /admin routes answer 503.")


async def admin_key(settings: SettingsDep,
                    x_api_key: Annotated[str | None, Security(ADMIN_KEY_HEADER)] = None) -> None:
    """Pass only with the configured admin key (503 when none is configured, 401 otherwise)."""
    key = settings.serving.admin_api_key
    if key is None or not key.get_secret_value():  # the config refuses an empty key; never compare with ""
        raise HTTPException(status_code=503, detail="admin API disabled: set serving.admin_api_key")
    given = (x_api_key or "").encode()
    if not hmac.compare_digest(given, key.get_secret_value().encode()):
        raise HTTPException(status_code=401, detail="missing or wrong X-API-Key",
                            headers={"WWW-Authenticate": "APIKey"})


def _matches(given: str | None, key: SecretStr | None) -> bool:
    if key is None or not key.get_secret_value() or given is None:
        return False
    return hmac.compare_digest(given.encode(), key.get_secret_value().encode())


def debug_checked_body(body: RecommendRequest, settings: Settings, x_api_key: str | None) -> RecommendRequest:
    """``body``, once a debug request (or an explain request, unless ``serving.explain_needs_key`` is off) has
    shown the admin or the debug key (403 otherwise).

    A plain header, not a security scheme: the route stays public in OpenAPI, the key opens only debug.
    """
    cfg = settings.serving
    what = "debug" if body.debug else "explain" if body.explain and cfg.explain_needs_key else None
    if what is None:
        return body
    why = "" if what == "debug" else " (reasons name items of the user's history; serving.explain_needs_key)"
    if cfg.admin_api_key is None and cfg.debug_api_key is None:
        raise HTTPException(status_code=403, detail=f"{what} answers are turned off{why}: configure "
                                                    "serving.debug_api_key (or serving.admin_api_key) and send it as "
                                                    "X-API-Key")
    if not (_matches(x_api_key, cfg.admin_api_key) or _matches(x_api_key, cfg.debug_api_key)):
        raise HTTPException(status_code=403, detail=f"{what} answers need X-API-Key{why}: the admin key or "
                                                    f"serving.debug_api_key; send {what}: false without one")
    return body


@dataclass(frozen=True)
class RecommendCall:
    """One ``POST /v1/recommend`` call, checked: the body, the recommender, the request id and the origin."""

    body: RecommendRequest
    recommender: Recommender
    request_id: str
    origin: str | None


async def recommend_call(
    request: Request, body: RecommendRequest,
    x_api_key: Annotated[str | None, Header(description=(
        "Needed only with debug: true: the admin key or serving.debug_api_key."))] = None,
    x_request_id: Annotated[str | None, Header()] = None,
    x_recsys_origin: Annotated[str | None, Header(
        description="`console` for the operator console's requests: not logged as impressions.")] = None,
) -> RecommendCall:
    """The checks in the order the route always answered them: limits (422), the debug key (403), then
    readiness (503)."""
    state = request.app.state
    body = debug_checked_body(checked_body(body, state.settings), state.settings, x_api_key)
    return RecommendCall(body, loaded_recommender(state.slot), request_id(request, x_request_id), x_recsys_origin)


RecommenderDep = Annotated[Recommender, Depends(get_recommender)]
RecommendCallDep = Annotated[RecommendCall, Depends(recommend_call)]
MetricsDep = Annotated[ServingMetrics, Depends(get_metrics)]
BackendDep = Annotated[OnlineBackend, Depends(get_backend)]
AdminDep = Depends(admin_key)
