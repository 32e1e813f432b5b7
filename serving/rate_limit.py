"""A per-client rate limit on the anonymous write route, ``POST /v1/events``.

Events need no key, so one client could otherwise write as fast as the server accepts, each
made-up user id adding keys to Redis. ``EventRateLimit`` is an ASGI middleware holding a
token bucket per client (``rate_per_s`` tokens a second, at most ``burst`` saved up): a call
that finds the bucket empty gets 429 with ``Retry-After`` (whole seconds until a token is
back) and a detail naming the setting, before its body is read.

The client is the connection's peer address (``serving.run`` turns uvicorn's ``X-Forwarded-For``
handling off: it trusts the header from loopback), or, when ``client_header`` is configured
(``serving.rate_limit_client_header``), that header's value: set it only behind a gateway that
writes the header itself, since a client could otherwise name itself anew on every call.

Buckets live in the worker process (``--workers N`` allows N times the rate in all) and are
bounded: past ``max_clients`` the least recently seen client is forgotten, which gives it a
full bucket on its next call, never a lower limit for anyone else.

>>> bucket = TokenBuckets(rate_per_s=2.0, burst=2, clock=lambda: 0.0)
>>> [bucket.take("a") for _ in range(3)]
[0.0, 0.0, 0.5]

Deliberately left out: limits shared across workers (a Redis round trip per call) and limits
on the read routes, which write nothing for unknown users (``serving.online_state``).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send


class TokenBuckets:
    """``take(client)``: 0.0 when the client may go on, else the seconds until it may."""

    def __init__(self, rate_per_s: float, burst: int, max_clients: int = 100_000,
                 clock: Callable[[], float] = time.monotonic):
        if rate_per_s <= 0 or burst < 1 or max_clients < 1:
            raise ValueError(f"TokenBuckets: need rate_per_s > 0, burst >= 1, max_clients >= 1; got {rate_per_s}, "
                             f"{burst}, {max_clients}")
        self.rate, self.burst, self.max_clients, self.clock = rate_per_s, burst, max_clients, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client -> (tokens, at)
        self._lock = threading.Lock()

    def take(self, client: str) -> float:
        now = self.clock()
        with self._lock:
            tokens, at = self._buckets.pop(client, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            wait = 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate
            self._buckets[client] = (tokens - 1.0 if wait == 0.0 else tokens, now)
            while len(self._buckets) > self.max_clients:
                self._buckets.popitem(last=False)
            return wait

    def __len__(self) -> int:
        return len(self._buckets)


class EventRateLimit:
    """429 for a client past its rate on the ``paths`` (POST); every other call passes untouched."""

    def __init__(self, app: ASGIApp, rate_per_s: float, burst: int, client_header: str | None = None,
                 paths: tuple[str, ...] = ("/v1/events",), on_limited: Callable[[], None] | None = None,
                 max_clients: int = 100_000):
        self.app, self.paths, self.on_limited = app, frozenset(paths), on_limited
        self.header = client_header.lower().encode() if client_header else None
        self.buckets = TokenBuckets(rate_per_s, burst, max_clients) if rate_per_s > 0 else None

    def client(self, scope: Scope) -> str:
        if self.header is not None:
            for name, value in scope.get("headers", []):
                if name.lower() == self.header:
                    return "h:" + value.decode("latin-1")
        peer = scope.get("client")
        return "a:" + (str(peer[0]) if peer else "unknown")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (self.buckets is None or scope["type"] != "http" or scope.get("method") != "POST"
                or scope["path"] not in self.paths):
            await self.app(scope, receive, send)
            return
        wait = self.buckets.take(self.client(scope))
        if wait <= 0:
            await self.app(scope, receive, send)
            return
        if self.on_limited is not None:
            self.on_limited()
        retry = max(1, math.ceil(wait))
        body = json.dumps({"detail": f"too many events from this client: at most {self.buckets.rate:g} a second "
                                     f"(bursts of {self.buckets.burst}; serving.events_rate_per_s); retry in "
                                     f"{retry} s"}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"retry-after", str(retry).encode())]
        await send({"type": "http.response.start", "status": 429, "headers": headers})
        await send({"type": "http.response.body", "body": body})
