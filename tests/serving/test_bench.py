from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from serving.bench import bench_run, start_server_subprocess, summarise, zipf_weights
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
    with pytest.raises(ValueError, match="must not be empty"):
        bench_run("http://127.0.0.1:1", [], ["m1"])


def test_zipf_weights_by_hand() -> None:
    assert zipf_weights(2, 1.0).tolist() == pytest.approx([2 / 3, 1 / 3])
    assert zipf_weights(4, 0.0).tolist() == [0.25] * 4


@pytest.mark.slow
def test_real_server_subprocess_answers_the_benchmark(toy_dir: Path) -> None:
    settings = toy_settings()
    with start_server_subprocess(settings, toy_dir, app_factory="tests.serving.toy:create_toy_app_from_env") as url:
        assert url.startswith("http://127.0.0.1:")
        bounded = bench_run(url, ["u1", "u2", "stranger"], ["m1", "m2"], seconds=30, max_requests=20, k=3,
                            event_share=0.0)
        timed = bench_run(url, ["u1", "u3"], ["m5"], seconds=0.5, concurrency=3, k=2, event_share=0.5, run_tag="b")
    # 20 calls, 3 users: each user's first call runs the pipeline, its repeats hit the result cache
    assert (bounded["requests"], bounded["errors"]) == (20, 0)
    assert bounded["paths"]["light"] == 3 and bounded["paths"]["cache"] == 17
    assert bounded["p50_ms"] <= bounded["p95_ms"] <= bounded["p99_ms"]
    assert timed["errors"] == 0 and timed["concurrency"] == 3 and set(timed["events"]) == {"200"}
    assert timed["paths"].get("light", 0) >= 2  # clicks bumped history versions: cache misses ran the pipeline


@pytest.mark.slow
def test_server_subprocess_reports_a_failed_load(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="split.json"), start_server_subprocess(
        toy_settings(), tmp_path, app_factory="tests.serving.toy:create_toy_app_from_env"
    ):
        pass
