"""ASGI middleware of the HTTP service: request body size limit, request id and access log.

``BodySizeLimit`` refuses bodies over ``max_bytes`` with 413 before the app parses them:
at once when ``Content-Length`` declares too much, and while reading when a chunked body
grows past the limit (the app then sees a 413 ``HTTPException`` from ``receive``, which
FastAPI re-raises instead of wrapping it as a 400 parse error).

``RequestContext`` gives every request an id (see its docstring).

Deliberately left out: rate limiting and client authentication (a gateway's job here).
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid

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
        body = json.dumps({"detail": BodyTooLarge(self.max_bytes).detail}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


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
