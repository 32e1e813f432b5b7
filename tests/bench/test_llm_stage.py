"""``bench.llm_stage.bench_llm`` end to end on toy artifacts: every section and key of the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.llm_stage import bench_llm
from cascade.settings import Settings
from tests.llm_rerank.factories import save_tiny_llm, tiny_split


@pytest.mark.slow
def test_bench_llm_reports_all_three_comparisons(tmp_path: Path) -> None:
    save_tiny_llm(tmp_path / "m")
    tiny_split().save(tmp_path / "toy" / "split")
    settings = Settings.build({"artifacts_dir": str(tmp_path), "llm": {"model": str(tmp_path / "m"),
                                                                        "candidates": 5}})
    partial: list[list[str]] = []
    report = bench_llm(settings, tmp_path / "toy", tmp_path / "work", requests=3, calib_requests=2, concurrency=2,
                       batch_requests=4, block_tokens=8, on_section=lambda r: partial.append(sorted(r)))
    assert report["candidates_from"] == "popularity" and report["candidates"] == 5
    assert set(report["precision"]) >= {"fp32", "bf16", "int8", "int8_speedup_vs_bf16"}
    for precision in ("fp32", "bf16", "int8"):
        row = report["precision"][precision]
        assert set(row) == {"stage_ms_p50", "stage_ms_p99", "tokens_per_s", "top10_overlap_vs_fp32",
                            "spearman_vs_fp32", "ndcg@10"}
        assert row["stage_ms_p99"] >= row["stage_ms_p50"] > 0 and 0 <= row["ndcg@10"] <= 1
    assert report["precision"]["fp32"]["top10_overlap_vs_fp32"] == 1.0  # the reference against itself
    assert json.loads((tmp_path / "work" / "llm_w8a8" / "calibration.json").read_text())["prompts"] == 2
    cache = report["prefix_cache"]
    assert cache["max_abs_score_diff"] < 1e-3  # fp32: cached == uncached
    assert cache["hit_rate"] > 0 and cache["stats"]["tier2_hits"] > 0
    assert {"cold_ms_p50", "warm_ms_p50", "tier2_ms_p50", "uncached_ms_p50"} <= set(cache)
    assert "max_abs_score_diff" in cache["bf16"]
    batching = report["batching"]
    assert batching["concurrency"] == 2 and batching["rps_batched"] > 0 and batching["rps_unbatched"] > 0
    assert set(partial[0]) < set(partial[1]) and "precision" in partial[0]  # saved after each finished section
    with pytest.raises(KeyError):
        report["precision"]["fp16"]
