"""Redis killed with SIGKILL under load, then restarted on the same socket: no 5xx, degraded, recovery.

A real uvicorn server (the toy pipeline) is driven by 4 client threads while the test's own
``redis-server`` is killed and brought back. Recommendations must all be 200, flagged
``degraded`` while Redis is away and not after it is back; an event sent while Redis is
down is refused with 503 (not recorded) and accepted once when the client retries it.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from serving.bench import start_server_subprocess
from serving.redis_state import EmbeddedRedis
from tests.reliability.conftest import RECALL, RULES
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
