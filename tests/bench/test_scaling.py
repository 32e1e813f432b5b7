"""The scaling report: growth ratios by hand, the memory sampler, one tiny size end to end."""

from __future__ import annotations

import doctest
import subprocess
import sys
from pathlib import Path

import pytest

from bench import scaling
from bench.scaling import growth, measure_one
from tests.heavy import HEAVY


def test_docstring_examples() -> None:
    assert doctest.testmod(scaling).failed == 0


def test_growth_leaves_missing_figures_empty() -> None:
    rows = [{"interactions": 100, "train_s": {"a": 0.0}, "eval_ms_per_user_p50": 2.0, "peak_rss_mib": 10.0},
            {"interactions": 300, "train_s": {"a": 1.0, "b": 2.0}, "eval_ms_per_user_p50": 3.0, "peak_rss_mib": 40.0}]
    assert growth(rows)[1] == {"interactions_x": 3.0, "train_s_x": {"a": None, "b": None},
                               "eval_ms_per_user_x": 1.5, "peak_rss_x": 4.0}


_PEAK_RSS = """
from bench.scaling import PeakRss

rss = PeakRss(every_s=0.01)
base = rss.mark()
block = bytearray(200 * 2**20)  # touched pages count: 200 MiB
block[:: 4096] = b"x" * len(block[:: 4096])
during = rss.mark()
del block
rss.mark()  # closes the period the block lived in (a sample taken before it is dropped, not carried over)
print(base, during, rss.mark())
"""


def test_peak_rss_sees_an_allocation_and_resets() -> None:
    # in a fresh process: a long test session's own heap (and other threads) would blur the figures
    out = subprocess.run([sys.executable, "-c", _PEAK_RSS], capture_output=True, text=True, check=True, timeout=120)
    base, during, after = (float(x) for x in out.stdout.split())
    assert during >= base + 150 and after < base + 150


@pytest.mark.slow
def test_one_tiny_size_end_to_end(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text("recall: {dim: 16, max_len: 10, n_blocks: 1, n_heads: 1, max_epochs: 2, eval_every: 2,"
                      " use_text: false}\ncoarse: {n_estimators: 10, min_child_samples: 5, train_positions: 1}\n")
    row = measure_one(4000, tmp_path / "n4000", config, eval_users=40)
    assert row["users"] == 100 and abs(row["interactions"] - 4000) < 800
    assert set(row["train_s"]) == {"recall", "recall_holdout", "coarse", "fusion"}
    assert row["peak_rss_mib"] >= max(row["train_peak_mib"].values()) - 1
    assert row["eval_users"] == 40 and set(row["ndcg10"]) == {"recall", "coarse", "final"}
    assert 0.0 <= row["candidate_recall"]["recall"] <= 1.0 and row["eval_ms_per_user_p50"] > 0


def test_growth_exponents_are_log_log_slopes() -> None:
    rows = [{"interactions": n, "train_s": {"linear": n / 1000, "flat": 5.0}, "eval_s": (n / 1000) ** 2}
            for n in (1_000, 10_000, 100_000)]
    assert scaling.growth_exponents(rows) == {"linear": 1.0, "flat": 0.0, "eval": 2.0}
    assert scaling.growth_exponents(rows[:1]) == {"linear": None, "flat": None, "eval": None}


def test_overrides_are_stated_and_applied() -> None:
    overrides = scaling.run_overrides(5e8, "local:2")
    assert overrides == {"recall": {"max_train_logits": 5e8}, "ray": {"address": "local:2"},
                         "coarse": {"cold_item_dropout": 0.0, "young_item_copies": 0.0}}
    settings = scaling.bench_settings(None, overrides)
    assert settings.recall.max_train_logits == 5e8 and settings.ray.address == "local:2"
    assert settings.coarse.cold_item_dropout == settings.coarse.young_item_copies == 0.0 and settings.coarse.max_train_users == 10_000
    with pytest.raises(SystemExit):
        scaling.main(["--ray", "nowhere", "--out", "x.json"])


@pytest.mark.slow
@HEAVY
def test_one_tiny_size_on_a_local_cluster(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    config = tmp_path / "tiny.yaml"
    config.write_text("recall: {dim: 16, max_len: 10, n_blocks: 1, n_heads: 1, max_epochs: 2, eval_every: 2,"
                      " use_text: false}\ncoarse: {n_estimators: 10, min_child_samples: 5, train_positions: 1}\n")
    row = measure_one(4000, tmp_path / "n4000", config, eval_users=40,
                      overrides=scaling.run_overrides(1e6, "local:2"))
    engines = row["engines"]
    assert engines["channels"]["equal"] and engines["eval"]["equal"]
    assert engines["eval"]["ndcg10"]["ray"] == engines["eval"]["ndcg10"]["in_process"]
    assert engines["coarse"]["ray"]["user_sample"] == "all 100 users (coarse.max_train_users not reached)"
    assert engines["eval"]["max_worker_peak_mib"] > 0
    assert row["two_tower_cap"]["max_train_logits"] == 1e6
    assert row["two_tower_cap"]["fits"]["recall"]["stopped_by"] in ("max_train_logits", "max_epochs", "early_stopping")
