"""Redis killed with SIGKILL under load: no 5xx, degraded while away, recovery.

An external Redis (the test's own ``redis-server``) is killed and brought back by hand while
a real uvicorn server (the toy pipeline) is driven by 4 client threads. Recommendations must
all be 200, flagged ``degraded`` while Redis is away and not after it is back; an event sent
while Redis is down is refused with 503 (not recorded) and accepted once when retried.

The embedded Redis (no ``REDIS_URL``) is supervised: ``kill -9`` of its ``redis-server``
under load must be repaired by the server itself, a new ``redis-server`` started, events
accepted again and ``degraded`` gone, no recommendation failing. How fast it recovers is
measured by ``recsys bench reliability``, not asserted here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from cascade.settings import ENV_REDIS_URL
from recsys.redis_server import EmbeddedRedis
from serving.app import create_app
from serving.run import shared_state
from serving.server_process import start_server_subprocess
from tests.reliability.conftest import RECALL, RULES, TOY_PAIRS
from tests.serving.conftest import toy_pipeline
from tests.serving.toy import toy_settings

TOY_FACTORY = "tests.serving.toy:create_toy_app_from_env"


@pytest.mark.slow
def test_redis_killed_mid_load_degrades_then_recovers(redis_server: EmbeddedRedis, toy_dir) -> None:
    settings = toy_settings(RECALL, RULES, redis_retry_min_s=0.05, redis_retry_max_s=0.3, result_cache_ttl_s=5)
    answers: list[tuple[float, int, bool | None]] = []  # (time, status, degraded)
    lock = threading.Lock()
    stop = threading.Event()

    def client_loop(base: str, worker: int) -> None:
        with httpx.Client(base_url=base, timeout=10) as http:
            while not stop.is_set():
                resp = http.post("/v1/recommend", json={"user_id": f"u{1 + worker % 3}", "k": 3})
                degraded = resp.json().get("degraded") if resp.status_code == 200 else None
                with lock:
                    answers.append((time.monotonic(), resp.status_code, degraded))

    event = {"event_id": "ev-during-outage", "user_id": "u1", "item_id": "m6", "type": "click"}
    with start_server_subprocess(settings, toy_dir, app_factory=TOY_FACTORY, ready_timeout_s=60) as base:
        threads = [threading.Thread(target=client_loop, args=(base, w)) for w in range(4)]
        for t in threads:
            t.start()
        try:
            time.sleep(0.5)
            assert redis_server.proc is not None
            redis_server.proc.kill()  # SIGKILL: no shutdown, sockets cut
            redis_server.proc.wait()
            killed_at = time.monotonic()
            time.sleep(1.0)
            during = httpx.post(base + "/v1/events", json=event, timeout=10)
            assert httpx.get(base + "/readyz", timeout=10).json()["redis"] is False
            redis_server.start()  # same unix socket, empty data (no persistence)
            back_at = time.monotonic()
            recovered = _wait_recovered(answers, lock, back_at, timeout_s=10)
            time.sleep(0.3)
        finally:
            stop.set()
            for t in threads:
                t.join()
        retried = httpx.post(base + "/v1/events", json=event, timeout=10)
        again = httpx.post(base + "/v1/events", json=event, timeout=10)
        ready = httpx.get(base + "/readyz", timeout=10).json()
    statuses = {status for _, status, _ in answers}
    assert statuses == {200}, f"non-200 answers: {statuses}"
    assert any(d for t, _, d in answers if killed_at < t < back_at), "no answer was flagged degraded"
    assert recovered, "answers still degraded 10 s after Redis came back"
    last = [d for t, _, d in answers if t > recovered + 0.05]
    assert last and not any(last)
    assert during.status_code == 503 and "event not recorded" in during.json()["detail"]
    assert retried.status_code == 200 and retried.json()["status"] == "accepted"
    assert again.json()["status"] == "duplicate"  # recorded exactly once
    assert ready["redis"] is True


def _wait_recovered(answers: list, lock: threading.Lock, since: float, timeout_s: float) -> float | None:
    """The time of the first non-degraded answer that arrived after ``since``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with lock:
            ok = [t for t, status, d in answers if t > since and status == 200 and d is False]
        if ok:
            return ok[0]
        time.sleep(0.05)
    return None


@pytest.mark.parametrize("owner", ["app", "serve"])
def test_embedded_redis_killed_mid_load_is_restarted_and_the_server_recovers(
    toy_dir: Path, monkeypatch: pytest.MonkeyPatch, owner: str
) -> None:
    """``kill -9`` of the embedded redis-server under load: restarted, events and non-degraded answers back.

    ``app``: the app starts its own embedded Redis (``OnlineBackend.open``); ``serve``: the
    process starts it before the app (``serving.run.shared_state``, what ``recsys serve`` does)
    and the backend finds its supervisor by URL. The breaker's backoff is the default (0.2 s
    doubling to 5 s), so recovery cannot come from waiting it out.
    """
    monkeypatch.delenv(ENV_REDIS_URL, raising=False)
    settings = toy_settings(RECALL, RULES, result_cache_ttl_s=5)
    answers: list[tuple[float, float, int, bool | None]] = []  # (sent, answered, status, degraded)
    lock, stop = threading.Lock(), threading.Event()

    def client_loop(client: TestClient, worker: int) -> None:
        for n in range(20_000):  # bounded: the test stops it long before
            if stop.is_set():
                return
            sent = time.monotonic()
            resp = client.post("/v1/recommend", json={"user_id": f"u{1 + (worker + n) % 3}", "k": 3})
            degraded = resp.json().get("degraded") if resp.status_code == 200 else None
            with lock:
                answers.append((sent, time.monotonic(), resp.status_code, degraded))

    with contextlib.ExitStack() as stack:
        if owner == "serve":
            settings = stack.enter_context(shared_state(settings, workers=1, artifact_dir=toy_dir))
        app = create_app(settings, toy_dir, pipeline=toy_pipeline(toy_dir, settings, TOY_PAIRS))
        client = stack.enter_context(TestClient(app, raise_server_exceptions=False))
        supervisor = app.state.backend.supervisor
        assert supervisor is not None and supervisor.supervise
        threads = [threading.Thread(target=client_loop, args=(client, w)) for w in range(4)]
        for t in threads:
            t.start()
        try:
            time.sleep(0.5)
            assert supervisor.proc is not None
            old_pid = supervisor.proc.pid
            os.kill(old_pid, signal.SIGKILL)
            killed_at = time.monotonic()
            events_back = _event_accepted_after(client, killed_at, timeout_s=10)
            time.sleep(1.0)  # keep the load on after recovery: no degraded answer may come back
        finally:
            stop.set()
            for t in threads:
                t.join()
        ready = client.get("/readyz").json()
        new_pid = supervisor.proc.pid if supervisor.proc is not None else None

    statuses = {status for _, _, status, _ in answers}
    assert statuses == {200}, f"failed recommendations: {statuses}"
    assert new_pid is not None and new_pid != old_pid and ready["redis_restarts"] == 1
    assert ready["redis"] is True
    assert events_back is not None, "no event accepted within 10 s of the kill"
    degraded_until = max((done for _, done, _, d in answers if d), default=killed_at)
    print(f"\nembedded redis kill -9 ({owner}): events back after {events_back - killed_at:.3f} s, "
          f"last degraded answer at {degraded_until - killed_at:.3f} s, "
          f"{sum(1 for *_, d in answers if d)} degraded of {len(answers)} answers")
    after = [d for sent, _, _, d in sorted(answers) if sent > max(events_back, degraded_until)]
    assert after, "no load after recovery"
    assert not any(after), "a degraded answer after the recovery"  # degraded is over, and stays over


def _event_accepted_after(client: TestClient, since: float, timeout_s: float) -> float | None:
    """Post a new click every 20 ms until one is accepted; the time it was, else None."""
    deadline, n = since + timeout_s, 0
    while time.monotonic() < deadline:
        n += 1
        resp = client.post("/v1/events", json={"event_id": f"ev-after-kill-{n}", "user_id": "u1",
                                                "item_id": "m6", "type": "click"})
        if resp.status_code == 200 and resp.json()["status"] == "accepted":
            return time.monotonic()
        assert resp.status_code == 503, resp.text  # refused while Redis is away, never a 500
        time.sleep(0.02)
    return None
