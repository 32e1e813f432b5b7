"""The simple baselines every eval reports, checked by hand on a three-user split."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from jobs.evaluation.baselines import (
    baseline_rankings,
    baseline_warnings,
    recent_popularity,
    versus_best_baseline,
)
from offline.schema import Vocab
from offline.split import Split


def _hand_split() -> Split:
    # train: u0 [0, 1], u1 [1, 2], u2 [1]; valid (3, 0, 2); test (2, 4, 0)
    train = pd.DataFrame({"user_idx": [0, 0, 1, 1, 2], "item_idx": [0, 1, 1, 2, 1],
                          "rating": np.ones(5, dtype=np.float32), "timestamp": [1, 2, 1, 2, 1]})
    vocab = Vocab.build(pd.Series(["a", "b", "c"]), pd.Series([f"i{i}" for i in range(5)]))
    return Split(name="hand", vocab=vocab, items=pd.DataFrame({"item_id": vocab.item_ids}),
                 users=pd.DataFrame({"user_id": vocab.user_ids}), train=train,
                 valid=np.array([3, 0, 2]), test=np.array([2, 4, 0]),
                 valid_ts=np.array([3, 3, 3]), test_ts=np.array([4, 4, 4]))


def test_covisitation_ranks_neighbours_of_the_last_items_then_popularity() -> None:
    # co-visitation (window 10, backward 0.5): W[0,1]=1, W[1,0]=0.5, W[1,2]=1, W[2,1]=0.5.
    # u2 (history [1]): item 2 (1.0), item 0 (0.5), then the unseen zero-score items by popularity [1,3,1,0,0]
    ranks = baseline_rankings(_hand_split(), "valid", k=3)["covisit_last"]
    assert ranks[2].tolist() == [2, 0, 3]
    # u0 (history [0, 1], item 1 the most recent): item 2 from item 1; 0 and 1 are its history
    assert ranks[0].tolist() == [2, 3, 4]


def test_recent_popularity_counts_the_newest_events_and_breaks_ties_by_all_time_counts() -> None:
    split = _hand_split()
    # valid: the newest 20% of train events by timestamp are those at t=2 (items 1 and 2)
    np.testing.assert_allclose(recent_popularity(split, "valid"), [0.25, 1.75, 1.25, 0.0, 0.0])
    assert baseline_rankings(split, "valid", k=3)["popularity_recent"][2].tolist() == [2, 0, 3]
    # test: the valid items (t=3) are the newest events
    np.testing.assert_allclose(recent_popularity(split, "test"), np.array([1, 0, 1, 1, 0]) + np.array([2, 3, 2, 1, 0]) / 4)


def test_every_baseline_excludes_the_input_history() -> None:
    split = _hand_split()
    for name, ranks in baseline_rankings(split, "test", k=3).items():
        for u in range(split.n_users):
            assert not set(ranks[u].tolist()) & set(split.history(u, "test").tolist()), name


def test_versus_best_baseline_names_the_best_and_its_verdict() -> None:
    rng = np.random.default_rng(0)
    base = rng.uniform(0, 0.2, 500)
    per_user = {"weak": {"ndcg@10": base * 0.5}, "strong": {"ndcg@10": base},
                "better": {"ndcg@10": base + 0.05}, "same": {"ndcg@10": base.copy()}}
    beats = versus_best_baseline(per_user, ["weak", "strong"], "better", 10)
    assert beats["best"] == "strong" and beats["verdict"] == "beats"
    assert beats["ndcg@10"]["mean"] == pytest.approx(0.05)
    assert versus_best_baseline(per_user, ["weak", "strong"], "same", 10)["verdict"] == "ties"
    assert versus_best_baseline(per_user, ["better"], "strong", 10)["verdict"] == "loses"


def test_a_warning_says_when_the_served_order_does_not_beat_the_best_baseline() -> None:
    assert baseline_warnings({"baselines": {"best": "ease", "verdict": "beats"}}) == []
    assert baseline_warnings({}) == []
    tie = {"baselines": {"best": "ease", "verdict": "ties", "ndcg@10": {"mean": 0.001, "ci95": [-0.002, 0.004]}}}
    (line,) = baseline_warnings(tie)
    assert "does not beat the simple baseline 'ease'" in line and "-0.0020 to +0.0040" in line


def test_the_warning_names_the_rules_when_the_order_beats_the_baseline_without_them() -> None:
    section = {"best": "covisit_last", "verdict": "loses", "ndcg@10": {"mean": -0.046, "ci95": [-0.092, -0.002]}}
    (plain,) = baseline_warnings({"baselines": section})
    assert "rules" not in plain
    free = {"best": "covisit_last", "verdict": "beats", "ndcg@10": {"mean": 0.018, "ci95": [0.004, 0.031]}}
    (line,) = baseline_warnings({"baselines": {**section, "without_rules": free}})
    assert "is below the simple baseline 'covisit_last'" in line
    assert "with every rule off it beats it (+0.0180 (95% CI +0.0040 to +0.0310))" in line
    tied = {**free, "verdict": "ties"}
    (still,) = baseline_warnings({"baselines": {**section, "without_rules": tied}})
    assert "rules" not in still
