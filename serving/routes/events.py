"""POST /v1/events: record one user-item event in Redis, at most once per ``event_id``.

The event goes to the Redis stream and, for history event types (``serving.history_event_types``:
clicks, ratings, purchases...; not impressions), onto the user's online history at once, so
the user's next recommendation reflects it (its history version changes, which also retires
its cached answers). With an active experiment the entry records it and the user's variant,
which the server derives from the user id: a client naming another arm gets a 422 (it would
credit that arm with the user's clicks). With no experiment running, a ``variant`` the client
sends is ignored, not stored: no arm is being measured, and a stored one would be counted by
a later `recsys ab analyze` as if the server had assigned it. An unknown ``item_id`` is a 422
naming the field, and so is a ``value`` or ``ts`` that is not a finite number within bounds
(``serving.schemas.EventRequest``: no NaN, no ``ts: 1e300``), so nothing absurd reaches the
history or the stream; Redis down, or full (at its memory cap with nothing it may evict), is a
503 (the event is not recorded, the client may retry with the same ``event_id``). Each client
is held to ``serving.events_rate_per_s`` (429 with ``Retry-After``, ``serving.rate_limit``).
"""

from __future__ import annotations

import time

from fastapi import APIRouter, HTTPException
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError

from recsys.experiments import assign
from recsys.redis_client import RedisUnavailable
from serving.deps import MetricsDep, RecommenderDep, SettingsDep
from serving.schemas import EventRequest, EventResponse

router = APIRouter(prefix="/v1", tags=["events"])


@router.post("/events", response_model=EventResponse,
             responses={429: {"description": "Too many events from this client (see Retry-After)."},
                        503: {"description": "Not ready, or Redis unavailable or full (event not recorded)."}})
async def post_event(body: EventRequest, recommender: RecommenderDep, settings: SettingsDep,
                     metrics: MetricsDep) -> EventResponse:
    item_idx = recommender.catalog.item_index.get(body.item_id)
    if item_idx is None:
        err = {"type": "value_error", "loc": ("body", "item_id"), "msg": f"unknown item_id {body.item_id!r}",
               "input": body.item_id}
        raise RequestValidationError([err], body=body.model_dump())
    online = recommender.online
    if online is None:
        raise HTTPException(status_code=503, detail="online state unavailable: events are not recorded")
    appends = body.type in settings.serving.history_event_types
    fields = {"user_id": body.user_id, "item_id": body.item_id, "type": body.type,
              "ts": f"{body.ts if body.ts is not None else time.time():.3f}"}
    if body.value is not None:
        fields["value"] = repr(body.value)
    experiment = recommender.experiment
    if experiment is not None:  # the variant is a pure function of the user: the server's, never the client's
        arm = assign(experiment, body.user_id).variant
        if body.variant and body.variant != arm:  # a client naming another arm would credit it with the click
            err = {"type": "value_error", "loc": ("body", "variant"), "input": body.variant,
                   "msg": f"variant {body.variant!r} is not the arm of user {body.user_id!r} in experiment "
                          f"{experiment.name!r} ({arm!r}); send that one, or none"}
            raise RequestValidationError([err], body=body.model_dump())
        fields["experiment"], fields["variant"] = experiment.name, arm
    user_idx = recommender.catalog.user_index.get(body.user_id)
    try:
        result = await run_in_threadpool(online.ingest, body.event_id, body.user_id, user_idx,
                                         item_idx if appends else None, fields,
                                         known=body.user_id in recommender.catalog.outside)
    except RedisUnavailable as exc:
        metrics.events.labels(body.type, "unavailable").inc()
        metrics.redis_errors.inc()
        raise HTTPException(status_code=503, detail=f"event not recorded: {exc}") from None
    metrics.events.labels(body.type, result.status).inc()
    return EventResponse(
        event_id=body.event_id, status=result.status,
        appended_to_history=result.history_version is not None,
        history_version=result.history_version, stream_id=result.stream_id,
    )
