"""Several uvicorn workers sharing one Redis: hot rule swaps reach every worker, nothing fails."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import httpx
import pytest

from serving.run import shared_state
from tests.serving.conftest import ADMIN_KEY, RECALL, RULES
from tests.serving.toy import DEFAULT_GATES, toy_settings

BLOCK_M4 = {"version": "block-m4", "rules": [{"id": "no_m4", "kind": "blocklist", "items": {"item_ids": ["m4"]}}],
            "acknowledge_dropped_gates": DEFAULT_GATES}


def test_shared_state_starts_one_redis_for_all_workers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("REDIS_URL")
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    with shared_state(toy_settings(), workers=2, artifact_dir=tmp_path) as settings:
        url = settings.redis_url
        assert url is not None and url.startswith("unix://") and Path(url[len("unix://"):]).exists()
        metrics_dir = os.environ["PROMETHEUS_MULTIPROC_DIR"]
        assert Path(metrics_dir).is_dir()
    assert not Path(url[len("unix://"):]).exists() and not Path(metrics_dir).exists()
    with shared_state(toy_settings().model_copy(update={"redis_url": "redis://x:1/0"}), workers=1,
                      artifact_dir=tmp_path) as kept:
        assert kept.redis_url == "redis://x:1/0" and "PROMETHEUS_MULTIPROC_DIR" not in os.environ


def _fresh_get(url: str) -> httpx.Response:
    with httpx.Client(timeout=10) as c:  # a new connection each time, so both workers get traffic
        return c.get(url)


def _sample_both(url: str, pids: set[int], timeout_s: float = 30.0) -> list[tuple[int, str]]:
    """(pid, rules version) from fresh /readyz calls until every worker of ``pids`` has answered at least
    twice (the kernel may send a busy moment's connections all to one worker, so no fixed window)."""
    seen: list[tuple[int, str]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(sum(p == pid for p, _ in seen) < 2 for pid in pids):
        ready = _fresh_get(url + "/readyz").json()
        seen.append((ready["pid"], ready["versions"]["rules"]))
    return seen


@pytest.mark.slow
def test_rule_change_and_rollback_reach_both_workers_within_two_seconds(toy_dir: Path, tmp_path: Path) -> None:
    from serving.server_process import start_server_subprocess

    settings = toy_settings(RECALL, RULES, admin_api_key=ADMIN_KEY)  # default 0.5 s version poll
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    with start_server_subprocess(settings, toy_dir, app_factory="tests.serving.toy:create_real_rules_app_from_env",
                                 workers=2, extra_env=env) as url:
        pids: set[int] = set()
        deadline = time.monotonic() + 60
        while len(pids) < 2 and time.monotonic() < deadline:
            resp = _fresh_get(url + "/readyz")
            if resp.status_code == 200:
                pids.add(resp.json()["pid"])
        assert len(pids) == 2, "the second worker never became ready"

        answers: list[tuple[float, int, list[str], str]] = []  # (time, status, items, rules version)
        stop = threading.Event()

        def loop() -> None:
            with httpx.Client(base_url=url, timeout=10) as client:
                while not stop.is_set():
                    resp = client.post("/v1/recommend", json={"user_id": "u1", "k": 3})
                    body = resp.json() if resp.status_code == 200 else {}
                    answers.append((time.monotonic(), resp.status_code, [i["id"] for i in body.get("items", [])],
                                    body.get("versions", {}).get("rules", "")))

        threading.Thread(target=loop, daemon=True).start()
        time.sleep(0.5)
        auth = {"X-API-Key": ADMIN_KEY}
        assert httpx.put(url + "/admin/rules", content=json.dumps(BLOCK_M4), headers=auth).status_code == 200
        time.sleep(2.0)  # the allowance; from here on every worker must serve the new version
        after_put = _sample_both(url, pids)
        back = httpx.post(url + "/admin/rules/rollback", json={"version": "default-3", "acknowledge_dropped_gates": [
            "blocklist:no_m4"]}, headers=auth)
        assert back.status_code == 200
        time.sleep(2.0)
        after_back = _sample_both(url, pids)
        stop.set()
        time.sleep(0.3)
        metrics = httpx.get(url + "/metrics").text

    assert answers and all(status == 200 for _, status, _, _ in answers)
    assert all(("m4" in items) == (rules == "default-3") for _, _, items, rules in answers)
    for window, version in ((after_put, "block-m4"), (after_back, "default-3")):
        assert {pid for pid, _ in window} == pids  # both workers answered...
        assert {v for _, v in window} == {version}  # ...and both served the new version
    # multi-process metrics: the answers of both workers are counted together
    total = sum(float(line.split()[-1]) for line in metrics.splitlines()
                if line.startswith("recsys_requests_total{"))
    assert total >= len(answers) - 1
