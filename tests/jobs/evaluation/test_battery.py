"""The robustness battery: its shapes built from ML-100K, its rows and its table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.evaluation.battery import (
    battery_table,
    generic_full,
    generic_with_items,
    log_only,
    long_histories,
    movielens_csv,
    run_battery,
    shape_row,
    widened,
)
from offline.loaders import detect_format, load_dataset


def _run(ndcg: dict[str, float], *, verdict: str = "beats", best: str = "ease", out_of_budget: bool = False) -> dict:
    return {"n_users": 943, "n_items": 1349,
            "stages": {k: {"ndcg@10": v} for k, v in ndcg.items()},
            "candidate_recall": {"recall@200": 0.8},
            "baselines": {"best": best, "verdict": verdict},
            "recall_train": {"recall": {"epochs": 40, "best_epoch": 32, "out_of_budget": out_of_budget,
                                        "out_of_time": False}},
            "warnings": []}


def test_a_row_averages_the_seeds_and_says_whether_every_fit_converged() -> None:
    seeds = {"per_seed": {"42": _run({"ease": 0.10, "recall": 0.11, "coarse": 0.12, "final": 0.12}),
                          "43": _run({"ease": 0.10, "recall": 0.13, "coarse": 0.14, "final": 0.14},
                                     out_of_budget=True)},
             "n_users": 943, "n_items": 1349}
    row = shape_row(seeds)
    assert row["seeds"] == 2 and row["stages"]["final"] == {"mean": 0.13, "sd": 0.01414}
    assert row["converged"] is False and row["epochs"] == [40, 40]
    table = battery_table({"ml100k": row, "amazon-scientific": {"skipped": "needs /x"}})
    assert "| ml100k | 943 × 1349 | 2 | ease 0.1000 ± 0.0000 | 0.1200 ± 0.0141 |" in table
    assert "| no |" in table and "| amazon-scientific | needs /x |" in table


def test_a_shape_whose_dataset_is_missing_is_skipped_with_the_path(tmp_path: Path) -> None:
    rows = run_battery(["ml100k-wide"], tmp_path / "datasets", tmp_path / "work", seeds=1, echo=lambda _: None)
    assert "needs" in rows["ml100k-wide"]["skipped"] and "ml-100k" in rows["ml100k-wide"]["skipped"]


@pytest.mark.ml100k
def test_the_shapes_built_from_ml100k(ml100k_dir: Path, tmp_path: Path) -> None:
    base = load_dataset(ml100k_dir)
    long = load_dataset(long_histories(ml100k_dir, tmp_path / "long"))
    assert long.interactions["user_id"].nunique() == 600
    counts = base.interactions["user_id"].value_counts()
    assert long.interactions["user_id"].value_counts().min() >= counts.sort_values().iloc[-600]
    wide = load_dataset(widened(ml100k_dir, tmp_path / "wide", factor=2))
    assert len(wide.items) == 3 * len(base.items)
    assert wide.interactions["item_id"].str.startswith("syn-").sum() >= 5 * 2 * len(base.items)
    last_two = wide.interactions.sort_values(["user_id", "timestamp"], kind="stable").groupby("user_id").tail(2)
    assert last_two["item_id"].str.startswith("syn-").mean() < 0.01  # held-out targets stay real (ties aside)
    csv = load_dataset(movielens_csv(ml100k_dir, tmp_path / "exported"))  # a name that says nothing
    assert detect_format(tmp_path / "exported") == "ml-csv"
    assert csv.interactions.equals(base.interactions) and csv.items["title"].equals(base.items["title"])
    full = load_dataset(generic_full(ml100k_dir, tmp_path / "full"))
    assert sorted(p.name for p in (tmp_path / "full").iterdir()) == ["interactions.csv", "items.csv", "users.csv"]
    assert full.users[["age", "gender", "occupation", "zip"]].equals(base.users[["age", "gender", "occupation", "zip"]])
    assert set(full.items["audience"]) == {"all", "teen", "adult"} and set(full.items["risk_level"]) == {0, 1}
    assert (full.items["year"].fillna(0) == base.items["year"].fillna(0)).all()
    assert json.loads(full.items["attributes"].iloc[0]) == {"release_date": "01-Jan-1995"}
    bare = log_only(ml100k_dir, tmp_path / "bare")
    assert sorted(p.name for p in bare.iterdir()) == ["interactions.csv"]
    assert len(load_dataset(bare).interactions) == len(base.interactions)
    full = load_dataset(generic_with_items(ml100k_dir, tmp_path / "generic"))
    assert sorted(p.name for p in (tmp_path / "generic").iterdir()) == ["interactions.csv", "items.csv"]
    assert len(full.interactions) == len(base.interactions) and len(full.items) == len(base.items)
    assert full.items.set_index("item_id")["title"].equals(base.items.set_index("item_id")["title"])

