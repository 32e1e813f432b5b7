"""Two server processes behind one load balancer share one Redis: what one learns, the other serves.

Serving scales out as separate processes (separate machines in production) with the same artifacts
and the same ``REDIS_URL``; nothing is held per process that a request to the other one would miss.
Toy catalog (tests/serving/toy.py) with the real rules stage: u1 has seen m1 m2 m3, so popularity
answers m4 m5 m6.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from serving.server_process import start_server_subprocess
from tests.serving.conftest import ADMIN_KEY, RECALL, RULES
from tests.serving.toy import DEFAULT_GATES, toy_settings

AUTH = {"X-API-Key": ADMIN_KEY}
BLOCK_M5 = {"version": "block-m5", "rules": [{"id": "no_m5", "kind": "blocklist", "items": {"item_ids": ["m5"]}}],
            "acknowledge_dropped_gates": DEFAULT_GATES}
FACTORY = "tests.serving.toy:create_real_rules_app_from_env"


def served(url: str, user: str = "u1") -> tuple[list[str], str]:
    body = httpx.post(url + "/v1/recommend", json={"user_id": user, "k": 3}, timeout=10).json()
    return [i["id"] for i in body["items"]], body["versions"]["rules"]


def until(url: str, want: list[str], timeout_s: float = 5.0) -> tuple[list[str], str]:
    """What ``url`` serves u1 once it serves ``want``, or at the deadline (a rule set is picked up at the
    next version poll, 0.2 s here)."""
    deadline = time.monotonic() + timeout_s
    got = served(url)
    while got[0] != want and time.monotonic() < deadline:
        time.sleep(0.1)
        got = served(url)
    return got


@pytest.mark.slow
def test_an_event_and_a_rule_set_sent_to_one_server_are_served_by_the_other(toy_dir: Path) -> None:
    settings = toy_settings(RECALL, RULES, admin_api_key=ADMIN_KEY, versions_poll_s=0.2)
    with (start_server_subprocess(settings, toy_dir, app_factory=FACTORY) as a,
          start_server_subprocess(settings, toy_dir, app_factory=FACTORY) as b):
        assert a != b
        assert served(a) == served(b) == (["m4", "m5", "m6"], "default-3")
        # a click on m4 through A is in u1's history on B: B no longer recommends it
        event = {"event_id": "ev-shared-1", "user_id": "u1", "item_id": "m4", "type": "click"}
        accepted = httpx.post(a + "/v1/events", json=event, timeout=10).json()
        assert (accepted["status"], accepted["appended_to_history"]) == ("accepted", True)
        assert served(b) == served(a) == (["m5", "m6"], "default-3")
        # the same event sent to B is a duplicate: both read one ledger
        assert httpx.post(b + "/v1/events", json=event, timeout=10).json()["status"] == "duplicate"
        # a rule set published through B is enforced by A (and B)
        put = httpx.put(b + "/admin/rules", content=json.dumps(BLOCK_M5), headers=AUTH, timeout=10)
        assert put.status_code == 200
        assert served(b) == (["m6"], "block-m5")
        assert until(a, ["m6"]) == (["m6"], "block-m5")
