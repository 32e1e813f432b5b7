"""The JSON shapes of the HTTP API (request body, response) and the configured request limits.

The request model fixes what never changes (types, id length, ``k >= 1``); limits that come
from configuration (``pipeline.max_k``, ``serving.max_context_*``) are checked by
``within_limits`` and reported in the same shape as pydantic's own errors, so a client
always gets a 422 whose ``loc`` names the offending field (and ``k = 10**9`` is told the same
configured bound as ``k = 101``). Numbers are finite: NaN and infinities never pass (the JSON
ones are refused before parsing by ``serving.middleware.JsonBodyCheck``), and event times and
values have sane bounds.

The response models are what the server returns: ``serving.response.build_response`` builds
a ``RecommendResponse`` once, the route declares it as its ``response_model`` (so FastAPI
validates it and OpenAPI at ``/docs`` documents it) and serves only the fields that were set:
``debug`` appears on debug answers only, ``fusion_weights`` on the fusion stage's hand-off only.

Deliberately left out: anything FastAPI-specific (routes, dependencies).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError

from cascade.serving_config import EVENT_TYPES
from cascade.settings import Settings
from recsys.documents import MAX_VERSION_CHARS, VERSION_PATTERN
from recsys.names import FORBIDDEN, MAX_ID_CHARS, canonical, forbidden_character
from serving.policy import RouteReason

# ids as the loaders read them (offline.loaders.checks.ids): surrounding whitespace stripped, no
# control or invisible format characters, in NFC (recsys.names), so " u01" is the dataset's "u01"
ID_PATTERN = VERSION_PATTERN


def _allowed_id(value: str) -> str:
    if (why := forbidden_character(value)) is not None:  # the position counts in the stripped, NFC id
        raise PydanticCustomError("id_character", "contains {why}", {"why": why})
    return value


# NFC first (a BeforeValidator runs before the constraints), so the bound is on the canonical spelling
# The pattern is published in the schema (/docs); the check names the offending character instead
# of echoing the pattern (the loaders' message, recsys.names.forbidden_character).
ExternalId = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_ID_CHARS),
                       BeforeValidator(lambda v: canonical(v) if isinstance(v, str) else v),
                       AfterValidator(_allowed_id), WithJsonSchema({"type": "string", "minLength": 1,
                                                                    "maxLength": MAX_ID_CHARS, "pattern": ID_PATTERN})]

# "cache": a cached answer; "llm": the LLM re-ranker ran; "fallback": a stage fell back; "light": no LLM
AnswerPath = Literal["cache", "light", "llm", "fallback"]
# Event times past this (2100-01-01T00:00:00Z) are refused: ts=1e300 is a typo or an attack, not a time.
MAX_EVENT_TS = 4_102_444_800.0
MAX_EVENT_VALUE = 1e9  # |value|: ratings, prices, dwell seconds all fit


class RecommendRequest(BaseModel):
    """POST /v1/recommend body. Strict types: ``"5"`` is not an integer, ``5`` is not a string."""

    model_config = ConfigDict(extra="forbid", strict=True)

    user_id: ExternalId = Field(description="External user id (no control or invisible format characters; surrounding "
                                "whitespace is stripped, as the loaders strip it); unknown ids get cold start.")
    # no static upper bound: within_limits names the configured pipeline.max_k for any k above it
    k: int = Field(10, ge=1, description="Items to return, 1..pipeline.max_k.")
    context: dict[str, Any] | None = Field(
        None, description="Request context (device, page, ...), at most serving.max_context_keys keys."
    )
    debug: bool = Field(False, description="Add removed items and per-stage scores to the answer (never cached).")
    llm: bool | None = Field(
        None, description="true: ask for the LLM path (when available); false: light path; null: the traffic policy."
    )
    explain: bool = Field(False, description="Give the top explain_k items a reason (one sentence written by the LLM "
                          "from the user's history and the item's data, checked, else a template).")
    explain_k: int | None = Field(None, ge=1, le=20, description="How many top items get a reason (default "
                                  "llm.explain.explain_k, 3; at most the list).")


class LimitError(ValueError):
    """The body breaks configured limits; ``errors`` holds pydantic-style dicts naming the fields."""

    def __init__(self, errors: list[dict]):
        super().__init__("; ".join(f"{e['loc'][-1]}: {e['msg']}" for e in errors))
        self.errors = errors


def within_limits(body: RecommendRequest, settings: Settings) -> RecommendRequest:
    """``body`` checked against the configured limits; raises ``LimitError`` naming each bad field.

    An omitted ``k`` means "the default, or fewer when pipeline.max_k is smaller", so a
    deployment with ``max_k < 10`` still accepts bodies without ``k``.
    """
    max_k, serving = settings.pipeline.max_k, settings.serving
    if "k" not in body.model_fields_set and body.k > max_k:
        body = body.model_copy(update={"k": max_k})
    errors: list[dict] = []
    if body.k > max_k:
        errors.append(_error(("body", "k"), f"Input should be less than or equal to {max_k}", body.k))
    if body.context is not None:
        n_keys = len(body.context)
        size = len(json.dumps(body.context, separators=(",", ":"), default=str))
        if n_keys > serving.max_context_keys:
            msg = f"context has {n_keys} keys, at most {serving.max_context_keys} allowed"
            errors.append(_error(("body", "context"), msg, None))
        elif size > serving.max_context_bytes:
            msg = f"context is {size} bytes as JSON, at most {serving.max_context_bytes} allowed"
            errors.append(_error(("body", "context"), msg, None))
    if errors:
        raise LimitError(errors)
    return body


def _error(loc: tuple[str, ...], msg: str, value: Any) -> dict:
    return {"type": "value_error", "loc": loc, "msg": msg, "input": value}


class StageInfo(BaseModel):
    name: str
    status: Literal["ok", "skipped", "fallback", "error", "cached"] = Field(
        description="cached: the answer came from the result cache, so the stage did not run for it (ms 0; the "
                    "reason says how it ran when the answer was computed).")
    ms: float
    n_in: int
    n_out: int
    reason: str


class RecommendedItem(BaseModel):
    id: str = Field(description="External item id.")
    title: str
    score: float | None = Field(description="Score of the column that ordered the answer (null when unscored).")
    rank: int = Field(ge=1)
    disclaimers: list[str]
    backfill: bool = Field(False, description="Reached from deeper candidates after the rules left the ranked list "
                           "short (ranked by the stage it came from, not by the served order: score is null).")
    reason: str | None = Field(None, description="Why it is recommended (explain requests, top explain_k items).")
    reason_source: Literal["llm", "template"] | None = Field(
        None, description="llm: written by the model and checked against the history and catalog; template: "
                          "built from the same evidence (the model's failed the check, overran or erred).")


class RemovedItem(BaseModel):
    id: str
    reason: str


class HandoffItem(BaseModel):
    id: str
    score: float | None = Field(description="This stage's own score (null where it wrote none).")
    channels: list[str] = Field(default_factory=list, description="Recall channels that found the item.")


class StageHandoff(BaseModel):
    stage: str
    n: int = Field(description="Items the stage handed on (after its depth cut).")
    order_by: str | None
    items: list[HandoffItem] = Field(description="The first 200 of them, in the order handed on.")
    fusion_weights: dict[str, float] | None = Field(None, description="Weights fusion used (fusion only).")


class DebugInfo(BaseModel):
    order_by: str | None = Field(description="Score column that defines the final order.")
    history_len: int
    removed: list[RemovedItem]
    item_scores: dict[str, dict[str, float | None]] = Field(description="item id -> stage -> score.")
    handoffs: list[StageHandoff] = Field(default_factory=list, description="What each stage handed on, in order.")


class RecommendResponse(BaseModel):
    request_id: str
    user_id: str
    cold_start: bool = Field(description="No history is known for this user (not in the catalog's users and no "
                             "events yet): recall leans on popularity and the user's attributes.")
    items: list[RecommendedItem]
    stages: list[StageInfo]
    versions: dict[str, str]
    fallbacks: list[str]
    path: AnswerPath
    complete: bool = Field(True, description="The list holds the k items asked for. False when the rules left "
                           "fewer compliant items than k even after reaching deeper (backfill).")
    short_by: int = Field(0, ge=0, description="How many items fewer than k the list holds (0 when complete).")
    short_reason: str | None = Field(None, description="Why the list is short, when it is.")
    route: RouteReason = Field(description="Why the policy chose the LLM path or not.")
    degraded: bool = Field(description="Redis was unavailable: split histories, no cache, no real-time events.")
    total_ms: float
    experiment: str | None = Field(None, description="The active experiment, when one is configured.")
    variant: str | None = Field(None, description="The user's arm in it (a variant name or 'holdout').")
    impressions_logged: bool = Field(False, description="The items were logged as impressions on the events stream.")
    debug: DebugInfo | None = Field(None, description="Present only when the request set debug.")

    def as_json(self) -> dict[str, Any]:
        """The JSON object the API serves: fields never set (``debug`` of a non-debug answer) left out."""
        return self.model_dump(mode="json", exclude_unset=True)


EventType = Literal[EVENT_TYPES]  # type: ignore[valid-type]


class EventRequest(BaseModel):
    """POST /v1/events body: one user-item interaction, recorded at most once per ``event_id``."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    event_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$",
                          description="Client-chosen unique id; a repeat is ignored and reported as duplicate.")
    user_id: ExternalId = Field(description="External user id.")
    item_id: ExternalId = Field(description="External item id; must be in the catalog.")
    type: EventType = Field(description="impression, click, rating, purchase or add_to_cart.")
    value: float | None = Field(None, ge=-MAX_EVENT_VALUE, le=MAX_EVENT_VALUE,
                                description="Rating value, price, dwell seconds... depending on type.")
    ts: float | None = Field(None, ge=0, le=MAX_EVENT_TS,
                             description="Client unix time (before 2100); the server's time when omitted.")
    # "" as before: no variant given, the server assigns one
    variant: str | None = Field(None, max_length=64, pattern=f"^[^{FORBIDDEN}]*$",
                                description="A/B variant that served the item (no control or invisible characters).")


class EventResponse(BaseModel):
    event_id: str
    status: Literal["accepted", "duplicate"]
    appended_to_history: bool
    history_version: int | None = Field(description="The user's history version after the event (None: unchanged).")
    stream_id: str | None


class RollbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    # the bounds VersionStore.publish enforces: whatever was published can be rolled back to
    version: str = Field(min_length=1, max_length=MAX_VERSION_CHARS, pattern=VERSION_PATTERN)
    acknowledge_dropped_gates: list[str] = Field(
        default_factory=list, max_length=100,
        description="Gates of the served rule set the rolled-back one drops, knowingly (rules.gates), "
                    "e.g. audience_gate:adult.")


class VersionEntry(BaseModel):
    version: str
    created_at: float
    active: bool


class VersionsResponse(BaseModel):
    kind: Literal["rules", "prompts"]
    active: str | None
    serving: str | None = Field(description="The version this worker serves now.")
    versions: list[VersionEntry]
