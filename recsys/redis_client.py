"""Redis clients for the online state: a client factory, a circuit breaker, the shared key names.

Which Redis: the caller says (``cascade.settings.Settings.resolve_redis_url``: ``redis_url``, env
``RECSYS_REDIS_URL``, else the plain ``REDIS_URL`` environment variable, the usual name in
container platforms); with none, the caller starts ``recsys.redis_server.EmbeddedRedis`` and
connects to its URL.

``connect`` builds clients with short socket timeouts and no client-side retries, and
``RedisGuard`` stops calling a Redis that just failed for an exponentially growing backoff, so
a dead Redis costs a request microseconds (skipped) or one refused connection, never seconds.
A serving worker opens one client and shares it (``serving.online_backend``): the online state,
the version store, the reason cache and the LLM's tier-2 prefix cache use its pool.

Deliberately left out: the embedded server process (``recsys.redis_server``), Redis
Cluster/Sentinel, TLS settings beyond what a ``rediss://`` URL says.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger(__name__)
T = TypeVar("T")
# ``{namespace}:events:added``: the sequence number of the last entry added to the events stream (each entry
# carries its own as ``seq``); MAXLEN trims the oldest and a crash may lose the newest, and `recsys ab analyze`
# counts both from the numbers (``serving.online_state``, ``jobs.ab.events``)
EVENTS_ADDED = "events:added"
# ``{namespace}:events:lost``: the ranges of sequence numbers serving acknowledged that Redis no longer holds
EVENTS_LOST = "events:lost"
DEFAULT_SOCKET_TIMEOUT_S = 0.25  # default of ServingConfig.redis_socket_timeout_s, the timeout of ``connect``
REDIS_DOWN_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


class RedisUnavailable(RuntimeError):
    """Redis did not answer (or is in its backoff window); the caller serves degraded."""


class RedisFull(RedisUnavailable):
    """Redis answered but refused a write: at its memory cap with nothing left it may evict.

    A ``RedisUnavailable`` (callers answer 503 or serve degraded) that does not open the breaker:
    Redis is up, and reads still work.
    """


def _is_out_of_memory(exc: redis.exceptions.ResponseError) -> bool:
    # a plain command raises OutOfMemoryError; inside a script it is a script error quoting Redis's reply
    return isinstance(exc, redis.exceptions.OutOfMemoryError) or "used memory > 'maxmemory'" in str(exc)


def connect(url: str | None, socket_timeout_s: float) -> redis.Redis:
    """A client for ``url`` that waits at most ``socket_timeout_s`` to connect or read (no retries).

    Raises ``ValueError`` when ``url`` is empty: start an ``EmbeddedRedis`` and pass its URL.
    """
    if not url:
        raise ValueError("no Redis URL: set settings.redis_url (RECSYS_REDIS_URL) or REDIS_URL, or start EmbeddedRedis")
    return redis.Redis.from_url(
        url, socket_timeout=socket_timeout_s, socket_connect_timeout=socket_timeout_s,
        retry=Retry(NoBackoff(), 0), health_check_interval=0,
    )


class RedisGuard:
    """A circuit breaker around Redis calls, shared by every thread of one worker.

    After a failure, calls raise ``RedisUnavailable`` at once for ``min_s``, doubling up to
    ``max_s`` while failures continue; the first call after the wait tries Redis again and a
    success closes the breaker (automatic recovery, no restart).
    """

    def __init__(self, min_s: float = 0.2, max_s: float = 5.0, clock: Callable[[], float] = time.monotonic):
        if not 0 < min_s <= max_s:
            raise ValueError(f"RedisGuard: need 0 < min_s <= max_s, got {min_s}, {max_s}")
        self.min_s, self.max_s, self.clock = min_s, max_s, clock
        self.failures = 0
        self.retry_at = 0.0
        self._lock = threading.Lock()

    @property
    def down(self) -> bool:
        return self.failures > 0

    def reset(self) -> None:
        """Close the breaker now (Redis is known to be back, e.g. just restarted): the next call tries it."""
        with self._lock:
            if self.failures:
                log.warning("redis restarted; closing the breaker after %d failed attempt(s)", self.failures)
            self.failures, self.retry_at = 0, 0.0

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()``, or ``RedisUnavailable`` when Redis is in backoff or fails to answer (``RedisFull`` when
        it refuses a write at its memory cap)."""
        if self.failures and self.clock() < self.retry_at:
            raise RedisUnavailable(f"redis down, next retry in {self.retry_at - self.clock():.2f} s")
        try:
            out = fn()
        except REDIS_DOWN_ERRORS as exc:
            self._failed(exc)
            raise RedisUnavailable(f"redis unavailable: {type(exc).__name__}: {exc}") from exc
        except redis.exceptions.ResponseError as exc:
            if _is_out_of_memory(exc):
                raise RedisFull("redis is full: at its memory cap (serving.redis_maxmemory_mb) with nothing it "
                                "may evict") from exc
            raise
        if self.failures:
            with self._lock:
                log.warning("redis is back after %d failed attempt(s)", self.failures)
                self.failures, self.retry_at = 0, 0.0
        return out

    def _failed(self, exc: BaseException) -> None:
        with self._lock:
            self.failures += 1
            wait = min(self.max_s, self.min_s * 2 ** (self.failures - 1))
            self.retry_at = self.clock() + wait
            if self.failures == 1:
                log.error("redis unavailable (%s: %s); serving degraded, retrying with backoff",
                          type(exc).__name__, exc)
