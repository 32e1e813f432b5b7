"""Redis clients (``recsys.redis_client``): the URL a client connects to, and the circuit breaker."""

from __future__ import annotations

import pytest
import redis

from recsys.redis_client import DEFAULT_SOCKET_TIMEOUT_S, RedisGuard, RedisUnavailable, connect
from tests.serving.toy import toy_settings


def test_redis_url_prefers_settings_then_env(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = toy_settings()  # built before the variable is set: it is read when the URL is resolved
    monkeypatch.setenv("REDIS_URL", "redis://env:6379/0")
    assert settings.resolve_redis_url() == "redis://env:6379/0"
    configured = settings.model_copy(update={"redis_url": "redis://cfg:1/2"})
    assert configured.resolve_redis_url() == "redis://cfg:1/2"
    monkeypatch.delenv("REDIS_URL")
    assert settings.resolve_redis_url() is None
    with pytest.raises(ValueError, match="no Redis URL"):
        connect(settings.resolve_redis_url(), DEFAULT_SOCKET_TIMEOUT_S)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_guard_backs_off_exponentially_then_recovers() -> None:
    clock, calls = Clock(), []

    def down() -> int:
        calls.append(clock.now)
        raise redis.exceptions.ConnectionError("refused")

    guard = RedisGuard(min_s=1.0, max_s=3.0, clock=clock)
    with pytest.raises(RedisUnavailable, match="refused"):
        guard.call(down)
    with pytest.raises(RedisUnavailable, match="next retry"):
        guard.call(down)  # within 1 s: skipped without touching Redis
    assert calls == [100.0] and guard.down
    clock.now = 101.0
    with pytest.raises(RedisUnavailable):
        guard.call(down)  # second failure: wait 2 s
    clock.now = 102.5
    with pytest.raises(RedisUnavailable, match="next retry"):
        guard.call(down)
    clock.now = 103.0
    assert guard.call(lambda: 7) == 7 and not guard.down
    assert calls == [100.0, 101.0]


def test_guard_reset_closes_the_breaker_at_once() -> None:
    clock = Clock()
    guard = RedisGuard(min_s=1.0, max_s=3.0, clock=clock)

    def down() -> int:
        raise redis.exceptions.ConnectionError("refused")

    for _ in range(3):
        clock.now += 5
        with pytest.raises(RedisUnavailable):
            guard.call(down)
    assert guard.down
    guard.reset()  # e.g. the supervisor restarted Redis: no need to sit out the 3 s backoff
    assert not guard.down and guard.call(lambda: 7) == 7
