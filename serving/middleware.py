"""ASGI middleware of the HTTP service: request body size limit.

``BodySizeLimit`` refuses bodies over ``max_bytes`` with 413 before the app parses them:
at once when ``Content-Length`` declares too much, and while reading when a chunked body
grows past the limit (the app then sees a 413 ``HTTPException`` from ``receive``, which
FastAPI re-raises instead of wrapping it as a 400 parse error).

Deliberately left out: rate limiting and authentication (a gateway's job here).
"""

from __future__ import annotations

import json

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


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
