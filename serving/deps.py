"""FastAPI dependencies of the routes, as ``Annotated`` aliases (one place, short routes).

Everything comes from ``app.state`` set by ``serving.app.create_app``: the ``Settings`` and
the ``ServiceSlot`` holding the loaded ``Recommender``. The dependencies are ``async def``
although none awaits: FastAPI runs a plain ``def`` dependency on the threadpool, one thread
hop each per request, for work that takes microseconds.
"""

from __future__ import annotations

import re
import uuid
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError

from recsys.settings import Settings
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
    if slot.recommender is None:
        raise HTTPException(status_code=503, detail=slot.describe())
    return slot.recommender


async def checked_body(body: RecommendRequest, settings: SettingsDep) -> RecommendRequest:
    """The request body within the configured limits (k <= pipeline.max_k, context size), else 422."""
    try:
        return within_limits(body, settings)
    except LimitError as exc:
        raise RequestValidationError(exc.errors, body=body.model_dump()) from None


async def request_id(x_request_id: Annotated[str | None, Header()] = None) -> str:
    """The caller's X-Request-ID when it is a sane token, else a fresh one."""
    if x_request_id is not None and _REQUEST_ID.fullmatch(x_request_id):
        return x_request_id
    return uuid.uuid4().hex


RecommenderDep = Annotated[Recommender, Depends(get_recommender)]
RecommendBody = Annotated[RecommendRequest, Depends(checked_body)]
RequestIdDep = Annotated[str, Depends(request_id)]
