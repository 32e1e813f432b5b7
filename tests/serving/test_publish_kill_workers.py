"""Publish, then kill -9 the shared Redis at once: with two uvicorn workers, neither reverts (real processes)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from recsys.redis_server import EmbeddedRedis
from serving.reliability.rules import sample_workers
from serving.server_process import start_server_subprocess
from tests.serving.conftest import ADMIN_KEY, RECALL, RULES
from tests.serving.toy import DEFAULT_GATES, toy_settings

TRIALS = 6


@pytest.mark.slow
def test_a_publish_survives_a_redis_killed_right_after_it(toy_dir: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    redis = EmbeddedRedis(tmp_path / "redis", supervise=True)  # restarted empty after a kill, as `recsys serve`'s
    url = redis.start()
    monkeypatch.setenv("REDIS_URL", url)
    settings = toy_settings(RECALL, RULES, admin_api_key=ADMIN_KEY, redis_retry_min_s=0.05, redis_retry_max_s=0.2)
    reverted = []
    try:
        with start_server_subprocess(settings, toy_dir, app_factory="tests.serving.toy:create_real_rules_app_from_env",
                                     workers=2, extra_env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}) as base:
            assert len(sample_workers(base, "default-3", 60)) == 2, "the second worker never became ready"
            for trial in range(TRIALS):
                doc = {"version": f"kill-{trial}", "acknowledge_dropped_gates": [*DEFAULT_GATES, "blocklist:trial_block"],
                       "rules": [{"id": "trial_block", "kind": "blocklist", "items": {"item_ids": [f"m{trial % 6 + 1}"]}}]}
                put = httpx.put(base + "/admin/rules", content=json.dumps(doc), headers={"X-API-Key": ADMIN_KEY})
                assert put.status_code == 200, put.text
                assert redis.proc is not None
                os.kill(redis.proc.pid, signal.SIGKILL)  # at once: the other worker has not polled yet
                deadline = time.monotonic() + 10
                while redis.restarts <= trial and time.monotonic() < deadline:
                    time.sleep(0.01)
                seen = sample_workers(base, doc["version"], 15)
                serving = {pid: versions[-1] for pid, versions in seen.items()}
                if len(serving) < 2 or set(serving.values()) != {doc["version"]}:
                    reverted.append((doc["version"], serving))
    finally:
        redis.close()
    assert reverted == []
