"""The soak benchmark against a real toy server: report shape, windows, memory readings."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.soak import soak, windows
from tests.reliability.conftest import RECALL, RULES
from tests.serving.toy import toy_settings


def test_windows_split_records_by_start_time_and_count_errors() -> None:
    records = [(0.1, 5.0), (0.9, 7.0), (1.2, None), (2.5, 1.0), (2.9, 3.0)]
    out = windows(records, seconds=3.0, window_s=1.0)
    assert [(w["start_s"], w["end_s"], w["requests"], w["errors"]) for w in out] == [
        (0.0, 1.0, 2, 0), (1.0, 2.0, 1, 1), (2.0, 3.0, 2, 0)]
    assert out[1]["p50_ms"] is None and out[2]["p50_ms"] == 2.0


@pytest.mark.slow
def test_soak_reports_errors_latency_windows_and_rss(toy_dir: Path) -> None:
    settings = toy_settings(RECALL, RULES)
    report = soak(settings, toy_dir, ["u1", "u2", "u3", "cold"], ["m1", "m2", "m3"], concurrency=2, seconds=2.0,
                  window_s=1.0, warmup_s=0.5, k=3, app_factory="tests.serving.toy:create_toy_app_from_env")
    assert report["errors"] == 0 and report["requests"] > 10
    assert report["p99_ms"] >= report["p50_ms"] > 0
    assert report["rss_start_mb"] > 20 and report["rss_end_mb"] > 20  # a python server with numpy/pandas
    assert [w["start_s"] for w in report["windows"]] == [0.0, 1.0]
    assert sum(w["requests"] for w in report["windows"]) == report["requests"]
    assert report["concurrency"] == 2 and report["seconds"] == 2.0
