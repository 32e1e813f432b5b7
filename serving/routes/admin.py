"""Admin API: publish, list and roll back versions of the rule set and the prompt template.

``PUT /admin/{rules|prompts}`` takes the document as YAML or JSON (bounded in size and alias
expansion, no duplicate keys: ``recsys.documents.parse_document``), validates it with its
owner's parser (``rules.schema.parse_ruleset`` plus each rules stage's ``check`` against its
catalog; for prompts the prompt applier), stores it as a new version in Redis, makes it
active and installs it in this worker at once; the other workers follow within
``serving.versions_poll_s`` (``serving.document_reload``). An invalid document is a 422 and the
current version keeps serving; so is a rule set that drops a gate the served one enforces
without ``acknowledge_dropped_gates`` (``rules.gates``). A 200 means the version is stored in
Redis and serving in this worker; a 503 means it was not applied, or, when Redis took the
write but its answer was lost, says how to check (``serving.versioned.PublishUnconfirmed``).
``POST /admin/{kind}/rollback {"version"}`` re-activates any published version (a rollback
that drops gates lists them in ``acknowledge_dropped_gates`` of its body). ``POST /admin/reload`` loads the artifact directory again off the
request path and swaps the new pipeline in only if it loads and passes a smoke request
(``serving.artifact_reload``); refused artifacts (a file whose digest differs from training's among
them) are a 422 naming the reason and the old pipeline keeps serving; a worker whose first load
failed becomes ready through it; a reload already running is a 409; it takes no body (one is a 422, not
silently ignored). Every route needs ``X-API-Key`` (``serving.deps.admin_key``; OpenAPI
declares it as the ``APIKey`` scheme, and the PUT body as YAML or JSON, so ``/docs`` can
publish a rule set).

Status codes: 401 missing/wrong key, 503 admin disabled or Redis down, 404 unknown version,
409 version reused for a different document (or no rules stage to install into), 422 invalid.
"""

from __future__ import annotations

from typing import Any, Literal

import anyio
from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool

from recsys.documents import InvalidVersion, parse_document
from recsys.manifest import damaged_file
from recsys.redis_client import RedisUnavailable
from serving.artifact_reload import ReloadRefused, load_checked, swap
from serving.deps import AdminDep, BackendDep, MetricsDep, RecommenderDep, SettingsDep, SlotDep
from serving.document_reload import PromptApplier, RulesApplier, document_json
from serving.online_backend import OnlineBackend
from serving.schemas import RollbackRequest, VersionEntry, VersionsResponse
from serving.versioned import PublishUnconfirmed, UnknownVersion, VersionConflict

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[AdminDep])
Kind = Literal["rules", "prompts"]
_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "Missing or wrong X-API-Key."}, 404: {"description": "Unknown version."},
    409: {"description": "Version reused for another document."}, 503: {"description": "Admin disabled or Redis down."},
}
_EXAMPLE_RULES = {
    "version": "my-rules-2", "description": "Published from /docs: the default gates and a blocklist.",
    "rules": [{"id": "withdrawn_items", "kind": "blocklist",
               "items": {"item_ids": ["withdrawn-0001"], "unknown_ids": "allow"}},
              {"id": "adult_gate", "kind": "audience_gate", "audience": "adult", "min_age": 18,
               "on_absent_attribute": "skip"},
              {"id": "teen_gate", "kind": "audience_gate", "audience": "teen", "min_age": 13,
               "on_absent_attribute": "skip"},
              {"id": "risk_tolerance", "kind": "risk_tolerance", "default_tolerance": 1, "on_absent_attribute": "skip"}],
}
_EXAMPLE_YAML = """version: my-rules-2
description: "Published from /docs: the default gates and a blocklist."
rules:
  - {id: withdrawn_items, kind: blocklist, items: {item_ids: [withdrawn-0001], unknown_ids: allow}}
  - {id: adult_gate, kind: audience_gate, audience: adult, min_age: 18, on_absent_attribute: skip}
  - {id: teen_gate, kind: audience_gate, audience: teen, min_age: 13, on_absent_attribute: skip}
  - {id: risk_tolerance, kind: risk_tolerance, default_tolerance: 1, on_absent_attribute: skip}
"""
# The route reads the raw body (YAML or JSON), so FastAPI cannot infer it: declare it for /docs.
_DOCUMENT_BODY: dict[str, Any] = {"requestBody": {
    "required": True,
    "description": "A rule set (rules.schema: version, description, rules, allow_empty) or a prompt "
                   "template, as JSON or YAML.",
    "content": {
        "application/json": {"schema": {"type": "object"}, "example": _EXAMPLE_RULES},
        "application/yaml": {"schema": {"type": "string"}, "example": _EXAMPLE_YAML},
    },
}}


def _applier(backend: OnlineBackend, kind: Kind) -> RulesApplier | PromptApplier:
    applier = backend.rules if kind == "rules" else backend.prompts
    if applier is None or backend.watcher is None:
        raise HTTPException(status_code=503, detail="service not ready")
    if not applier.available:
        raise HTTPException(status_code=409, detail=f"the pipeline has no enabled {kind} stage to install into")
    return applier


def _publish(backend: OnlineBackend, kind: Kind, text: bytes) -> dict[str, Any]:
    applier = _applier(backend, kind)
    source = f"PUT /admin/{kind}"
    backend.watcher.sync_once()  # type: ignore[union-attr]  # gates are compared with the stored active version
    try:
        data = parse_document(text, source)
        version, parsed = applier.validate(data, source)
        if isinstance(applier, RulesApplier):
            applier.check_gates(parsed, source)  # GatesDropped names the gates and the acknowledgement
    except ValueError as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from None
    try:
        done = backend.versions.publish(kind, version, document_json(data), floor=applier.seq)
    except InvalidVersion as exc:  # the bounds rollback accepts too (serving.versioned)
        raise HTTPException(status_code=422, detail=f"{source}: {exc}") from None
    except VersionConflict as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from None
    _install(backend, kind, version, parsed, data, done.seq)
    return {"kind": kind, "version": version, "status": done.status, "active": version, "sequence": done.seq}


def _install(backend: OnlineBackend, kind: Kind, version: str, parsed: Any, data: dict[str, Any], seq: int) -> None:
    if not backend.watcher.install(kind, version, parsed, data, seq):  # type: ignore[union-attr]
        # only a newer activation stored meanwhile outranks this one: it is stored, but not what serves
        raise HTTPException(status_code=409, detail=f"{kind} version {version!r} was stored, but a newer "
                            f"activation overtook it; GET /admin/{kind}/versions shows the active version")


def _rollback(backend: OnlineBackend, kind: Kind, version: str, acknowledged: list[str]) -> dict[str, Any]:
    applier = _applier(backend, kind)
    backend.watcher.sync_once()  # type: ignore[union-attr]  # gates are compared with the stored active version
    document = backend.versions.document(kind, version)
    if document is None:
        raise HTTPException(status_code=404, detail=f"{kind} version {version!r} was never published")
    try:  # stored before a rule got stricter, or this catalog lacks what it reads: refuse, keep serving
        data = parse_document(document, f"{kind} {version}")
        _, parsed = applier.validate(data, f"{kind} {version}")
        if isinstance(applier, RulesApplier):
            applier.check_gates(parsed, f"POST /admin/{kind}/rollback", acknowledged)
    except ValueError as exc:
        raise HTTPException(status_code=422, detail=f"cannot roll back: {exc}") from None
    try:
        done = backend.versions.rollback(kind, version, floor=applier.seq)
    except UnknownVersion as exc:
        raise HTTPException(status_code=404, detail=str(exc)) from None
    _install(backend, kind, version, parsed, data, done.seq)
    return {"kind": kind, "version": version, "status": "rolled_back", "active": version, "sequence": done.seq}


def _versions(backend: OnlineBackend, kind: Kind) -> VersionsResponse:
    applier = _applier(backend, kind)
    infos = backend.versions.versions(kind)
    active = next((i.version for i in infos if i.active), None)
    return VersionsResponse(kind=kind, active=active, serving=applier.applied,
                            versions=[VersionEntry(version=i.version, created_at=i.created_at, active=i.active)
                                      for i in infos])


async def _redis(fn: Any, *args: Any) -> Any:
    try:
        return await run_in_threadpool(fn, *args)
    except PublishUnconfirmed as exc:  # says itself whether it was applied and how to check
        raise HTTPException(status_code=503, detail=str(exc)) from None
    except RedisUnavailable as exc:  # before anything was written: nothing changed
        raise HTTPException(status_code=503, detail=f"{exc}; nothing was changed") from None


@router.put("/{kind}", responses={**_ERRORS, 422: {"description": "Invalid document; the detail says why."}},
            openapi_extra=_DOCUMENT_BODY)
async def put_version(kind: Kind, request: Request, backend: BackendDep, metrics: MetricsDep,
                      _: RecommenderDep) -> dict[str, Any]:
    out = await _redis(_publish, backend, kind, await request.body())
    metrics.reloads.labels(kind).inc()
    return out


@router.get("/{kind}/versions", response_model=VersionsResponse, responses=_ERRORS)
async def list_versions(kind: Kind, backend: BackendDep, _: RecommenderDep) -> VersionsResponse:
    return await _redis(_versions, backend, kind)


@router.post("/{kind}/rollback", responses=_ERRORS)
async def rollback(kind: Kind, body: RollbackRequest, backend: BackendDep, metrics: MetricsDep,
                   _: RecommenderDep) -> dict[str, Any]:
    out = await _redis(_rollback, backend, kind, body.version, body.acknowledge_dropped_gates)
    metrics.reloads.labels(kind).inc()
    return out


@router.post("/reload", responses={**_ERRORS, 409: {"description": "A reload is already running."},
                                   422: {"description": "The artifacts were refused (the old ones keep serving), "
                                                        "or a body was sent."}})
async def reload_artifacts(request: Request, backend: BackendDep, metrics: MetricsDep, settings: SettingsDep,
                           slot: SlotDep) -> dict[str, Any]:
    body = await request.body()
    if body:
        raise HTTPException(status_code=422, detail=f"POST /admin/reload takes no body (got {len(body)} bytes): "
                                                    "it reloads the served artifact directory")
    lock = getattr(request.app.state, "reload_lock", None)
    if lock is None:
        lock = request.app.state.reload_lock = anyio.Lock()
    if lock.locked():
        raise HTTPException(status_code=409, detail="a reload is already running")
    async with lock:
        artifact_dir = request.app.state.artifact_dir
        current = slot.recommender  # None: the first load failed, and this reload is how it recovers
        try:
            checked = await run_in_threadpool(load_checked, settings, artifact_dir, metrics, backend.client)
        except ReloadRefused as exc:
            metrics.errors.labels("reload_refused").inc()
            still = "still serving the previous artifacts" if current is not None else "nothing is served yet"
            slot.refused(str(exc), damaged_file(exc))
            raise HTTPException(status_code=422, detail=f"reload refused, {still}: {exc}") from None
        new = await run_in_threadpool(swap, slot, backend, checked)
    metrics.reloads.labels("artifacts").inc()
    return {"status": "reloaded", "artifact_dir": str(artifact_dir),
            "previous": current.versions() if current is not None else None, "versions": new.versions()}
