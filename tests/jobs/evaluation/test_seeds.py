"""``recsys eval --seeds N``: the per-seed layout, the summary arithmetic, and a tiny real run."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cascade.settings import Settings
from cli.main import app
from jobs.evaluation import seeds
from jobs.evaluation.seeds import evaluate_seeds, seed_dirs, share_split, summarize
from jobs.prepare import prepare
from jobs.train import DEFAULT_STAGES
from tests.jobs.test_train import TINY


def test_docstring_examples() -> None:
    assert doctest.testmod(seeds).failed == 0


def test_summary_mean_sd_values_and_beyond_sd() -> None:
    per_seed = {
        1: {"stages": {"coarse": {"ndcg@10": 0.10}}, "deltas": {"a_vs_b": {"ndcg@10": {"mean": 0.010, "ci95": [0, 1]}}},
            "train_s": {"recall": 3}, "ignored": {"x": 1.0}},
        2: {"stages": {"coarse": {"ndcg@10": 0.12}}, "deltas": {"a_vs_b": {"ndcg@10": {"mean": 0.012, "ci95": [0, 1]}}},
            "train_s": {"recall": 5}, "ignored": {"x": 2.0}},
        3: {"stages": {"coarse": {"ndcg@10": 0.14}}, "deltas": {"a_vs_b": {"ndcg@10": {"mean": -0.004, "ci95": [0, 1]}}},
            "train_s": {"recall": 7}, "ignored": {"x": 3.0}},
    }
    out = summarize(per_seed)
    assert set(out) == {"stages.coarse.ndcg@10", "deltas.a_vs_b.ndcg@10.mean", "train_s.recall"}
    assert out["stages.coarse.ndcg@10"] == {"mean": 0.12, "sd": 0.02, "values": [0.1, 0.12, 0.14]}
    assert out["train_s.recall"] == {"mean": 5.0, "sd": 2.0, "values": [3.0, 5.0, 7.0]}
    delta = out["deltas.a_vs_b.ndcg@10.mean"]  # mean 0.006, sd 0.00872: within the spread
    assert delta["mean"] == 0.006 and delta["sd"] == 0.00872 and delta["beyond_sd"] is False
    assert summarize({1: per_seed[1]})["stages.coarse.ndcg@10"]["sd"] == 0.0


def test_seed_dirs_and_split_sharing(tmp_path: Path) -> None:
    assert seed_dirs(tmp_path, 42, 3) == [(s, tmp_path / f"seed-{s}") for s in (42, 43, 44)]
    with pytest.raises(ValueError, match="--seeds must be >= 1, got 0"):
        seed_dirs(tmp_path, 1, 0)
    (tmp_path / "split").mkdir()
    (tmp_path / "split" / "split.json").write_text("{}")
    share_split(tmp_path, tmp_path / "seed-1")
    assert (tmp_path / "seed-1" / "split" / "split.json").read_text() == "{}"
    (tmp_path / "split" / "split.json").write_text('{"new": 1}')  # a new split replaces the old copy
    share_split(tmp_path, tmp_path / "seed-1")
    assert (tmp_path / "seed-1" / "split" / "split.json").read_text() == '{"new": 1}'


def test_cli_refuses_zero_seeds() -> None:
    res = CliRunner().invoke(app, ["eval", "--seeds", "0"])
    assert res.exit_code == 2 and "Invalid value for '--seeds'" in res.output


@pytest.mark.slow
def test_two_seeds_train_apart_and_summarise(tmp_path: Path) -> None:
    settings = Settings.build(TINY)
    art = tmp_path / "synthetic"
    split = prepare(None, art, n_users=60, n_items=120, seed=3)
    report = evaluate_seeds(settings, art, split, n_seeds=2, stages=DEFAULT_STAGES, progress=False)
    assert report["seeds"] == [42, 43]
    for s in (42, 43):
        assert (art / f"seed-{s}" / "recall" / "model.pt").is_file()
        assert (art / f"seed-{s}" / "eval_test.json").is_file()
    models = [(art / f"seed-{s}" / "recall" / "model.pt").read_bytes() for s in (42, 43)]
    assert models[0] != models[1]  # the seed reaches training
    summary = report["summary"]
    coarse = summary["stages.coarse.ndcg@10"]
    assert coarse["values"] == [report["per_seed"][s]["stages"]["coarse"]["ndcg@10"] for s in (42, 43)]
    assert "beyond_sd" in summary["deltas.coarse_vs_recall.ndcg@10.mean"]
    assert {"channel_recall.two_tower@200", "channel_recall.merged@200", "candidate_recall.recall@200"} <= set(summary)
