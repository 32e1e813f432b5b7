from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from serving.bench import bench_latency, start_server_subprocess, summarise
from tests.serving.toy import toy_settings


def test_summarise_percentiles_by_hand() -> None:
    report = summarise([float(v) for v in range(1, 101)], Counter({"http_503": 2}), Counter({"light": 100}), 1, 2.04)
    assert report["requests"] == 102 and report["errors"] == 2 and report["error_kinds"] == {"http_503": 2}
    assert (report["p50_ms"], report["p95_ms"], report["p99_ms"]) == (50.5, 95.05, 99.01)
    assert report["mean_ms"] == 50.5 and report["max_ms"] == 100.0
    assert report["rps"] == 50.0 and report["paths"] == {"light": 100}


def test_summarise_without_successes_has_no_latency() -> None:
    report = summarise([], Counter({"ConnectError": 3}), Counter(), 2, 1.0)
    assert report["p50_ms"] is None and report["errors"] == 3 and report["requests"] == 3


def test_bench_refuses_empty_users() -> None:
    with pytest.raises(ValueError, match="user_ids is empty"):
        bench_latency("http://127.0.0.1:1", [])


@pytest.mark.slow
def test_real_server_subprocess_answers_the_benchmark(toy_dir: Path) -> None:
    settings = toy_settings()
    with start_server_subprocess(settings, toy_dir, app_factory="tests.serving.toy:create_toy_app_from_env") as url:
        assert url.startswith("http://127.0.0.1:")
        sequential = bench_latency(url, ["u1", "u2", "stranger"], n_requests=20, k=3)
        concurrent = bench_latency(url, ["u1", "u3"], n_requests=10, concurrency=3, k=2, warmup=0)
    assert (sequential["requests"], sequential["errors"], sequential["paths"]) == (20, 0, {"light": 20})
    assert sequential["p50_ms"] <= sequential["p95_ms"] <= sequential["p99_ms"]
    assert (concurrent["requests"], concurrent["errors"], concurrent["concurrency"]) == (10, 0, 3)


@pytest.mark.slow
def test_server_subprocess_reports_a_failed_load(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="split.json"), start_server_subprocess(
        toy_settings(), tmp_path, app_factory="tests.serving.toy:create_toy_app_from_env"
    ):
        pass
