"""``bench.explanations``: every figure of the reasons benchmark, on the toy catalog around the real LLM
stage (tiny model); the fixtures are ``tests.jobs.test_explanations``'s (``tests/bench/conftest.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.explanations import bench_explanations
from cascade.settings import Settings


def test_the_benchmark_reports_every_figure(toy: tuple[Settings, Path], redis_url: str) -> None:
    settings, art = toy
    report = bench_explanations(settings, art, users=2, explain_ks=(1, 2), k=3, budget_ms=60_000.0)
    assert report["users"] == 2
    assert set(report["runs"]) == {"1", "2"}
    for ek, run in report["runs"].items():
        assert run["requests"] == 2 and 2 <= run["reasons"] <= 2 * int(ek)  # u3 has one item left to see
        assert run["schema_valid_share"] == 1.0  # the grammar admits nothing else
        assert 0.0 <= run["grounded_share"] <= 1.0
        assert run["template_share"] == pytest.approx(1.0 - run["grounded_share"])
        assert run["cache_hit_rate"] == 1.0
        assert run["extra_ms_p50"] is not None and run["extra_ms_p99"] >= run["extra_ms_p50"]
        assert len(run["sampled_reasons"]) == run["reasons"]
    assert report["backbone"].endswith("tiny-llm")
