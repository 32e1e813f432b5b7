"""The events route holds each client to a rate; nothing else is limited."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.rate_limit import TokenBuckets
from tests.serving.conftest import RECALL, RULES, client_for
from tests.serving.toy import AudienceRules, PopularityRecall

PAIRS = [(RECALL, PopularityRecall), (RULES, AudienceRules)]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_token_buckets_refill_at_the_rate_and_cap_at_the_burst() -> None:
    clock = Clock()
    buckets = TokenBuckets(rate_per_s=4.0, burst=2, clock=clock)
    assert [buckets.take("a") for _ in range(3)] == [0.0, 0.0, 0.25]
    assert buckets.take("b") == 0.0  # another client has its own bucket
    clock.now = 10.0  # idle for long: back to the burst, not 40 saved tokens
    assert [buckets.take("a") for _ in range(3)] == [0.0, 0.0, 0.25]


def test_token_buckets_forget_the_least_recent_client_past_the_bound() -> None:
    buckets = TokenBuckets(rate_per_s=1.0, burst=1, max_clients=3, clock=Clock())
    for n in range(10):
        buckets.take(f"fake-{n}")
    assert len(buckets) == 3


def test_token_buckets_refuse_a_zero_rate() -> None:
    with pytest.raises(ValueError, match="rate_per_s > 0"):
        TokenBuckets(rate_per_s=0.0, burst=1)


def _event(n: int) -> dict[str, str]:
    return {"event_id": f"flood-{n}", "user_id": f"fake-{n}", "item_id": "m1", "type": "click"}


def test_a_client_past_its_rate_gets_429_with_retry_after(toy_dir: Path) -> None:
    """A single client could write events (and keys for made-up users) as fast as the server accepted them."""
    with client_for(toy_dir, PAIRS, events_rate_per_s=0.5, events_rate_burst=3) as client:
        codes = [client.post("/v1/events", json=_event(n)).status_code for n in range(5)]
        assert codes == [200, 200, 200, 429, 429]
        refused = client.post("/v1/events", json=_event(9))
        assert refused.headers["Retry-After"] == "2" and refused.headers["X-Request-ID"]
        assert refused.json()["detail"] == ("too many events from this client: at most 0.5 a second (bursts of 3; "
                                            "serving.events_rate_per_s); retry in 2 s")
        assert client.post("/v1/recommend", json={"user_id": "u1", "k": 2}).status_code == 200  # reads: not limited
        assert 'recsys_errors_total{kind="rate_limited"} 3.0' in client.get("/metrics").text


def test_a_configured_client_header_names_the_client(toy_dir: Path) -> None:
    with client_for(toy_dir, PAIRS, events_rate_per_s=0.5, events_rate_burst=1,
                    rate_limit_client_header="X-Client-Id") as client:
        assert client.post("/v1/events", json=_event(0), headers={"X-Client-Id": "shop-a"}).status_code == 200
        assert client.post("/v1/events", json=_event(1), headers={"X-Client-Id": "shop-a"}).status_code == 429
        assert client.post("/v1/events", json=_event(2), headers={"X-Client-Id": "shop-b"}).status_code == 200


def test_a_zero_rate_turns_the_limit_off(toy_dir: Path) -> None:
    with client_for(toy_dir, PAIRS, events_rate_per_s=0, events_rate_burst=1) as client:
        assert {client.post("/v1/events", json=_event(n)).status_code for n in range(20)} == {200}


_SERVE = """
import sys
from pathlib import Path
import serving.run as run
from tests.serving.toy import toy_settings, use_toy_stage_kinds
use_toy_stage_kinds()
s = toy_settings()
s = s.model_copy(update={"serving": s.serving.model_copy(update={"events_rate_per_s": 0.01, "events_rate_burst": 2})})
run.serve(s, Path(sys.argv[1]), port=int(sys.argv[2]), workers=1)
"""


def test_a_made_up_forwarded_for_does_not_name_a_new_client(toy_dir: Path) -> None:
    """A real server: uvicorn trusts X-Forwarded-For from loopback by default, so a local client naming a new
    address on every call was never limited."""
    import os
    import subprocess
    import sys
    import time

    import httpx

    from serving.server_process import free_port

    port, repo = free_port(), Path(__file__).resolve().parents[2]
    env = {**{k: v for k, v in os.environ.items() if k != "REDIS_URL"}, "PYTHONPATH": str(repo)}
    server = subprocess.Popen([sys.executable, "-c", _SERVE, str(toy_dir), str(port)], cwd=repo, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        codes = [httpx.post(f"{url}/v1/events", json=_event(n), timeout=10,
                            headers={"X-Forwarded-For": f"10.0.{n}.1"}).status_code for n in range(6)]
        assert codes[:2] == [200, 200] and set(codes[2:]) == {429}, codes
    finally:
        server.terminate()
        server.wait(timeout=60)
