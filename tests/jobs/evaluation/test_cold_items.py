"""The cold-item protocol: the cutoff, a split without the new items' interactions, their slice."""

from pathlib import Path

import numpy as np
import pytest

import jobs.evaluation.cold_items
from cascade.settings import Settings
from jobs.evaluation.cascade_run import SCORED
from jobs.evaluation.cold_items import (
    clockless,
    cold_item_report,
    cold_split,
    first_seen,
    item_slices,
    measure_cold,
    new_items,
    prepare_cold,
    train_cold,
)
from jobs.evaluation.fit_report import training_warnings
from jobs.prepare import prepare
from tests.jobs.test_train import TINY


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    art = tmp_path_factory.mktemp("cold") / "synthetic"
    return art, prepare(None, art, n_users=60, n_items=120, seed=3)


def test_new_items_are_the_last_share_to_appear(synthetic) -> None:
    _, split = synthetic
    first = first_seen(split)
    new, cutoff = new_items(split, share=0.1)
    appeared = first < np.iinfo(np.int64).max
    assert np.all(first[new] > cutoff) and np.all(first[appeared & ~np.isin(np.arange(split.n_items), new)] <= cutoff)
    assert 0.05 * appeared.sum() <= len(new) <= 0.1 * appeared.sum() + 1
    with pytest.raises(ValueError, match="share must be in"):
        new_items(split, share=1.0)


def test_cold_split_trains_on_nothing_of_the_new_items(synthetic) -> None:
    _, split = synthetic
    cold = cold_split(split, share=0.1)
    new = cold.unseen_items
    assert len(new) == cold.protocol["cold_items"]["n_new"] > 0
    assert not np.isin(cold.train["item_idx"], new).any()
    assert all(not np.isin(seq, new).any() for seq in cold.train_sequences)
    assert cold.item_popularity("valid")[new].sum() == 0
    dropped = np.isin(split.train["item_idx"], new).sum()
    assert len(split.train) - len(cold.train) == dropped == cold.protocol["cold_items"]["dropped_train_interactions"]
    # valid items that are new are never learnt from; the original split has no unseen items
    np.testing.assert_array_equal(cold.valid_trainable(), ~np.isin(split.valid, new))
    assert split.valid_trainable().all() and len(split.unseen_items) == 0
    np.testing.assert_array_equal(cold.test, split.test)  # the same test requests


@pytest.mark.slow
def test_cold_item_report_trains_a_cold_cascade_and_slices_by_the_test_item(synthetic) -> None:
    art, split = synthetic
    settings = Settings.build(TINY)
    report = cold_item_report(settings, art, split, share=0.1, n_boot=200, progress=False)
    cold_dir, cold = prepare_cold(art, split, 0.1)
    assert cold_dir == art / "cold-items" and (cold_dir / "recall").exists() and (cold_dir / "coarse").exists()
    slices = report["slices"]
    new = np.isin(split.test, cold.unseen_items)
    assert slices["cold_item"]["users"] == int(new.sum()) > 0
    assert slices["warm_item"]["users"] == int((~new).sum())
    for row in slices.values():
        assert {"recall", "coarse", "final"} <= set(row["stages"])
        assert set(row["deltas"]) == {"coarse_vs_recall", "final_vs_coarse"}
        assert set(row["candidate_recall"]) == {"recall@200", "coarse@50"}  # as the main report's; the LLM is off
        assert all(0.0 <= v <= 1.0 for v in row["candidate_recall"].values())
    # unknown to every model, new items still reach recall's candidates through their content
    assert report["new_items_among_candidates"]["recall"] > 0
    assert report["new_items"] == len(cold.unseen_items) and report["item_side_knowledge"]["text"] is False
    again = cold_item_report(settings, art, split, share=0.1, n_boot=200, progress=False)
    assert again["slices"] == slices  # the cold cascade is reused, not retrained
    # its two-tower fits are checked like the main cascade's (the eval report lists these warnings too)
    trained = train_cold(settings, cold_dir, cold, progress=False)
    assert report["warnings"] == [f"cold-item cascade: {w}" for w in training_warnings(settings, trained)]


def test_cold_slices_report_candidate_recall_of_the_stages_that_ran_keyed_by_depth(
    synthetic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default LLM stage is off, yet the pipeline shows it coarse's lists (status ``skipped``): the
    slices used to report them as an ``llm`` candidate recall, under keys without depths
    (``recall``, ``coarse``, ``llm``) unlike the main report's ``recall@200``, ``coarse@50``."""
    _, split = synthetic
    cold = cold_split(split, share=0.1)
    targets = cold.targets("test")
    n = len(targets)
    kept = np.arange(n) % 2 == 0  # coarse keeps the target for even rows
    lists = {"recall": [np.array([t]) for t in targets],
             "coarse": [np.array([t] if k else [], dtype=np.int64) for t, k in zip(targets, kept, strict=True)]}
    lists["llm"] = lists["coarse"]
    run = {"tops": {s: np.full((n, 10), -1, dtype=np.int64) for s in (*SCORED, "final")}, "candidates": lists,
           "status": {"recall": {"ok": n}, "coarse": {"ok": n}, "llm": {"skipped": n}, "rules": {"ok": n}}}
    monkeypatch.setattr(jobs.evaluation.cold_items, "build_pipeline", lambda settings, directory, phase: None)
    monkeypatch.setattr(jobs.evaluation.cold_items, "memoised", lambda pipeline: pipeline)
    monkeypatch.setattr(jobs.evaluation.cold_items, "run_cascade", lambda *args, **kwargs: run)
    per_user: dict = {}
    report = measure_cold(Settings.build({}), Path("unused"), cold, n_boot=20, progress=False, per_user=per_user)
    for name, users in item_slices(cold, targets).items():
        assert report["slices"][name]["candidate_recall"] == {"recall@200": 1.0,
                                                              "coarse@50": round(float(kept[users].mean()), 5)}
        # the per-user table jobs.evaluation.cold_sources compares between variants skips it too
        assert {k for k in per_user[name] if k.startswith("candidates:")} == {"candidates:recall", "candidates:coarse"}


@pytest.mark.ml100k
@pytest.mark.amazon
def test_only_a_dataset_whose_timestamps_are_positions_is_clockless(ml100k_dir, amazon_scientific_dir) -> None:
    from offline.loaders import load_dataset
    from offline.protocol import make_split

    assert not clockless(make_split(load_dataset(ml100k_dir), k_core=5))  # unix seconds
    # published without times: each user's events are numbered 0, 1, 2, ...; no time cutoff applies
    assert clockless(make_split(load_dataset(amazon_scientific_dir), k_core=5))
