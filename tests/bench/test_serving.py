from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from bench.llm_path import bench_llm_path, latency_summary, served_llm_settings
from bench.serving import bench_run, bench_serve, summarise, zipf_weights
from recsys.config import StageSpec
from serving.server_process import start_server_subprocess
from tests.serving.toy import toy_settings

TOY_APP = "tests.serving.toy:create_toy_app_from_env"
RECALL = StageSpec(name="recall", kind="recall", on_error="fail")
LLM = StageSpec(name="llm", kind="llm", on_error="passthrough", budget_ms=5000)
RULES = StageSpec(name="rules", kind="rules", on_error="fail")


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


def test_latency_summary_by_hand() -> None:
    assert latency_summary([4.0, 1.0, 2.0, 3.0]) == {"n": 4, "p50_ms": 2.5, "p99_ms": 3.97, "mean_ms": 2.5}
    assert latency_summary([]) == {"n": 0, "p50_ms": None, "p99_ms": None, "mean_ms": None}


def test_bench_serve_refuses_an_llm_share_without_an_llm_stage(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="need an enabled LLM stage"):
        bench_serve(toy_settings(), tmp_path, ["u1"], ["m1"], llm_shares=(0.0, 0.3))


def test_served_llm_settings_apply_the_stage_params() -> None:
    spec = StageSpec(name="llm", kind="llm", budget_ms=3000, params={"precision": "fp32", "kv": {"enabled": False}})
    served = served_llm_settings(toy_settings(RECALL, spec, RULES))
    assert served["llm"]["precision"] == "fp32" and served["llm"]["kv"]["enabled"] is False
    assert served["llm"]["budget_ms"] == 3000
    default = served_llm_settings(toy_settings(RECALL, LLM, RULES))["llm"]
    assert (default["precision_setting"], default["kv"]["enabled"], default["kv"]["tier2"]) == ("auto", True, False)
    assert default["precision"] in ("bf16", "fp32")  # what this machine runs natively
    assert served_llm_settings(toy_settings()) == {}


def test_bench_llm_path_needs_enough_distinct_users() -> None:
    with pytest.raises(ValueError, match="need 5 distinct"):
        bench_llm_path("http://127.0.0.1:1", ["u1", "u2"], (1, 4), 2)


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
    assert bounded["by_path"]["light"]["n"] == 3 and bounded["by_path"]["cache"]["n"] == 17  # hits apart
    assert bounded["p50_ms"] <= bounded["p95_ms"] <= bounded["p99_ms"]
    assert timed["errors"] == 0 and timed["concurrency"] == 3 and set(timed["events"]) == {"200"}
    assert timed["paths"].get("light", 0) >= 2  # clicks bumped history versions: cache misses ran the pipeline


@pytest.mark.slow
def test_server_subprocess_reports_a_failed_load(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="split.json"), start_server_subprocess(
        toy_settings(), tmp_path, app_factory="tests.serving.toy:create_toy_app_from_env"
    ):
        pass


@pytest.mark.slow
def test_llm_path_rows_run_the_llm_stage_cold_then_warm(toy_dir: Path) -> None:
    settings = toy_settings(RECALL, LLM, RULES, result_cache_ttl_s=0.0)
    with start_server_subprocess(settings, toy_dir, app_factory=TOY_APP) as url:
        report = bench_llm_path(url, ["u1", "u2", "u3"], (1, 2), 1, k=3)
        light = bench_run(url, ["u1", "u2"], ["m1"], seconds=30, max_requests=6, k=3, event_share=0.0, llm=False)
    assert [row["concurrency"] for row in report["rows"]] == [1, 2]
    for row in report["rows"]:
        for phase in ("cold", "warm"):
            assert row[phase]["paths"] == {"llm": 1} and row[phase]["stage_status"] == {"ok": 1}
            assert row[phase]["stage_ms"]["n"] == 1 and row[phase]["errors"] == {}
            assert row[phase]["prefix_cache"]["lookups"] == 0  # the toy re-ranker has no prefix cache
    assert report["warmup_call"]["path"] == "llm"
    assert light["paths"] == {"light": 6}  # cache off, llm: false on every call


def test_bench_serve_refuses_fewer_than_one_worker(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="workers must be >= 1"):
        bench_serve(toy_settings(), tmp_path, ["u1"], ["m1"], workers=0)


@pytest.mark.slow
def test_bench_serve_runs_its_servers_with_two_workers(toy_dir: Path) -> None:
    report = bench_serve(toy_settings(), toy_dir, ["u1", "u2", "u3"], ["m1", "m2"], seconds=30, concurrencies=(2,),
                         app_factory=TOY_APP, workers=2, max_requests=8, k=3, event_share=0.0)
    assert report["workers"] == 2
    [light] = report["light_nocache"]
    assert (light["requests"], light["errors"], light["paths"]) == (8, 0, {"light": 8})
    assert [row["errors"] for row in report["cache_mix"]] == [0]
