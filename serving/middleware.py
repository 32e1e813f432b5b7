"""ASGI middleware of the HTTP service: request body size limit, request id and access log.

``BodySizeLimit`` refuses bodies over ``max_bytes`` with 413 before the app parses them:
at once when ``Content-Length`` declares too much, and while reading when a chunked body
grows past the limit (the app then sees a 413 ``HTTPException`` from ``receive``, which
FastAPI re-raises instead of wrapping it as a 400 parse error).

``JsonBodyCheck`` refuses a JSON API call whose body is not plain JSON before FastAPI parses
it, with a 4xx naming the problem (FastAPI would say only "error parsing the body", or 500
on an unpaired surrogate): wrong ``Content-Type`` (415), bytes that are not UTF-8 (UTF-16 and
UTF-32 too, which the route's ``json.loads(bytes)`` would have decoded past these checks), nesting
deeper than ``max_depth``, ``\\ud800``-style unpaired surrogates, integers longer than Python
converts (400), and ``NaN``/``Infinity``/``1e309`` anywhere in the body (422 in pydantic's
shape, ``loc`` naming the field: Python's ``json`` accepts them, and FastAPI's own 422 could
not even be written, since its error would echo a non-finite number: that was a 500). Each
refusal is counted by kind (``on_refused``, the app's ``recsys_errors_total``). Syntax errors
are left to FastAPI, whose 422 ``json_invalid`` already names the position.

``RequestContext`` gives every request an id (see its docstring).

The per-client rate limit of the event route is ``serving.rate_limit.EventRateLimit``.

Deliberately left out: client authentication (a gateway's job here).
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving.logs import request_id_var

access_log = logging.getLogger("serving.access")
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


class BodyTooLarge(HTTPException):
    def __init__(self, max_bytes: int):
        super().__init__(status_code=413, detail=f"request body exceeds {max_bytes} bytes (serving.max_body_bytes)")


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int):
        if max_bytes < 1:
            raise ValueError(f"BodySizeLimit: max_bytes must be >= 1, got {max_bytes}")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._reject(send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, limited_receive, send)

    async def _reject(self, send: Send) -> None:
        await _reply(send, 413, BodyTooLarge(self.max_bytes).detail)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyProblem(NamedTuple):
    status: int
    detail: Any  # a message, or pydantic-style errors for a 422
    kind: str  # label of recsys_errors_total


class JsonBodyCheck:
    """Checks the bodies of ``POST`` calls under ``prefixes`` (the JSON routes) and replays them.

    ``PUT /admin/{kind}`` is not covered: it takes YAML as well as JSON (``serving.document_reload``
    bounds it). The body is at most ``serving.max_body_bytes`` (``BodySizeLimit`` runs first),
    so buffering it here is cheap. ``on_refused(kind)`` is called for every refused body.
    The ``bodyless`` paths take no body at all: a body there is not checked as JSON (telling the
    client how to encode JSON would be wrong) but passed on, and the route refuses it (422).
    """

    def __init__(self, app: ASGIApp, max_depth: int, prefixes: tuple[str, ...] = ("/v1/", "/admin/"),
                 on_refused: Callable[[str], None] | None = None, bodyless: tuple[str, ...] = ("/admin/reload",)):
        self.app, self.max_depth, self.prefixes, self.on_refused = app, max_depth, prefixes, on_refused
        self.bodyless = frozenset(bodyless)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope.get("method") != "POST" or not scope["path"].startswith(self.prefixes)
                or scope["path"] in self.bodyless):
            await self.app(scope, receive, send)
            return
        chunks = []
        try:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    break
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
        except BodyTooLarge as exc:
            await _reply(send, exc.status_code, exc.detail)
            return
        body = b"".join(chunks)
        problem = json_body_problem(_header(scope, b"content-type"), body, self.max_depth)
        if problem is not None:
            if self.on_refused is not None:
                self.on_refused(problem.kind)
            await _reply(send, problem.status, problem.detail)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect

        await self.app(scope, replay, send)


def json_body_problem(content_type: str | None, body: bytes, max_depth: int) -> BodyProblem | None:
    """What is wrong with ``body`` as a JSON API body, or None when it is acceptable JSON.

    >>> json_body_problem("application/json", b'{"a": [1]}', 2) is None
    True
    >>> json_body_problem("text/plain", b"{}", 2).detail
    "Content-Type must be application/json, got 'text/plain'"
    >>> json_body_problem("application/json", b'{"a": [[1]]}', 2).detail
    'JSON nested deeper than 2 levels'
    >>> json_body_problem("application/json", b'{"a": [1, -Infinity]}', 2).detail
    [{'type': 'finite_number', 'loc': ['body', 'a', 1], 'msg': 'Input should be a finite number', 'input': '-Infinity'}]
    >>> json_body_problem("application/json", b'{"k": 5, "k": 50}', 2).detail[0]["msg"]
    "Key 'k' appears more than once in one object (which value counts is ambiguous)"
    """
    if not body:
        return None  # a body-less POST (/admin/reload); a route that needs one answers 422
    media = (content_type or "").split(";")[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        return BodyProblem(415, f"Content-Type must be application/json, got {content_type!r}", "unsupported_media_type")
    text = _utf8_text(body)
    if isinstance(text, BodyProblem):
        return text
    too_deep = BodyProblem(400, f"JSON nested deeper than {max_depth} levels", "body_too_deep")
    duplicates: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(items)
        if len(out) < len(items) and not duplicates:
            seen: set[str] = set()
            duplicates.extend(k for k, _ in items if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        return out

    try:
        data = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError:
        return None  # FastAPI's own 422 "json_invalid" names the position
    except RecursionError:
        return too_deep
    except ValueError as exc:  # an integer beyond sys.get_int_max_str_digits() digits
        return BodyProblem(400, f"body holds a number Python does not convert: {exc}", "number_too_long")
    if _deeper_than(data, max_depth):
        return too_deep
    if duplicates:  # json.loads keeps the last value silently; a client meaning the first gets the wrong answer
        key = duplicates[0]
        return BodyProblem(422, [{"type": "duplicate_key", "loc": ["body", key], "input": key,
                                  "msg": f"Key {key!r} appears more than once in one object (which value counts "
                                         "is ambiguous)"}], "duplicate_key")
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        return BodyProblem(400, f"body holds an unpaired UTF-16 surrogate escape ({exc.object[exc.start:exc.end]!a})",
                           "unpaired_surrogate")
    found = _first_non_finite(data)
    if found is not None:
        loc, value = found
        error = {"type": "finite_number", "loc": ["body", *loc], "msg": "Input should be a finite number",
                 "input": json.dumps(value)}  # NaN, Infinity or -Infinity, as the client may have spelled it
        return BodyProblem(422, [error], "non_finite_number")
    return None


def _utf8_text(body: bytes) -> str | BodyProblem:
    """``body`` as text, or a 400 when it is not UTF-8 (as the route's ``json.loads(bytes)`` would read it)."""
    if (problem := _not_utf8(body)) is not None:
        return problem
    try:
        # utf-8-sig: a leading byte-order mark is dropped, as Starlette's json.loads(bytes) drops it before the
        # route parses the body; decoded with the BOM kept, json.loads refused it and every check here was skipped
        return body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return BodyProblem(400, f"body is not valid UTF-8: byte {body[exc.start]:#04x} at offset {exc.start}",
                           "body_not_utf8")


def _not_utf8(body: bytes) -> BodyProblem | None:
    """A 400 for a body that the route's ``json.loads(bytes)`` would read as UTF-16 or UTF-32.

    ``json.detect_encoding`` (RFC 4627's guess from the NUL bytes of the first four, or a UTF-16/32
    byte-order mark) is what Starlette's ``Request.json()`` decodes by. ASCII text in UTF-16 or 32
    without a mark is valid UTF-8 (NULs), which ``json.loads(str)`` refuses as a syntax error: the
    checks here were skipped while the route parsed the document (duplicate keys passed, a
    surrogate was a 500). RFC 8259 requires UTF-8 between systems, so such a body is refused.

    A NUL byte where UTF-16 or UTF-32 text would not have one (``b'\\x00{"k": 5}'``: UTF-8 with a
    stray NUL, which the guess also reads as UTF-16-BE) is named as what it is, by its offset.

    >>> _not_utf8('{"k": 5}'.encode("utf-16-le")).detail
    'body is not UTF-8: it reads as UTF-16-LE (NUL bytes among its first four); send JSON as UTF-8'
    >>> _not_utf8(b'\\x00{"k": 5}').detail
    'body holds a NUL byte at offset 0 (JSON text has none); send the JSON document alone, as UTF-8'
    >>> _not_utf8(b'{"k": 5}') is None
    True
    """
    encoding = json.detect_encoding(body)
    if encoding in ("utf-8", "utf-8-sig"):
        return None
    if encoding in ("utf-16", "utf-32"):
        why = f"it starts with a {encoding.upper()} byte-order mark"
    elif all((body[i] == 0) == nul for i, nul in enumerate(_NUL_LAYOUT[encoding]) if i < len(body)):
        why = f"it reads as {encoding.upper()} (NUL bytes among its first four)"
    else:
        return BodyProblem(400, f"body holds a NUL byte at offset {body.index(0)} (JSON text has none); send the "
                                "JSON document alone, as UTF-8", "nul_byte")
    return BodyProblem(400, f"body is not UTF-8: {why}; send JSON as UTF-8", "body_not_utf8")


# Where the first four bytes of JSON text (whose first characters are ASCII) in each encoding are NUL.
_NUL_LAYOUT = {"utf-16-be": (True, False, True, False), "utf-16-le": (False, True, False, True),
               "utf-32-be": (True, True, True, False), "utf-32-le": (False, True, True, True)}


def _deeper_than(data: object, limit: int) -> bool:
    """Whether containers nest more than ``limit`` levels (iterative: no recursion to exhaust)."""
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return False


def _first_non_finite(data: object) -> tuple[list[str | int], float] | None:
    """The path to the first NaN or infinity in ``data`` (document order) and its value, or None.

    ``json.loads`` turns ``NaN``, ``Infinity`` and overflowing literals such as ``1e309`` into
    non-finite floats; strict JSON (RFC 8259) has none of them.
    """
    stack: list[tuple[list[str | int], object]] = [([], data)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            return path, node
        if isinstance(node, dict):
            stack.extend(([*path, key], child) for key, child in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend(([*path, i], child) for i, child in reversed(list(enumerate(node))))
    return None


async def _reply(send: Send, status: int, detail: Any) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class RequestContext:
    """Request id and access log: honours a sane ``X-Request-ID`` or makes one, echoes it back.

    The id goes into ``serving.logs.request_id_var`` (every log line of the request carries
    it) and into ``scope["state"]["request_id"]`` (the routes put it in the answer). One
    ``request`` log line per call records method, path, status and milliseconds.
    """

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = _header(scope, b"x-request-id")
        if rid is None or not _REQUEST_ID.fullmatch(rid):
            rid = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        token = request_id_var.set(rid)
        t0 = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                message = {**message, "headers": [*headers, (b"x-request-id", rid.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            ms = round((time.perf_counter() - t0) * 1000, 3)
            access_log.info("request", extra={"request_id": rid, "method": scope.get("method"),
                                              "path": scope.get("path"), "status": status, "ms": ms})
            request_id_var.reset(token)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None
