"""The coarse trainer's valid-set decisions: a challenger is served only beyond its paired CI."""

from __future__ import annotations

import numpy as np
import pytest

from coarse_rank.dataset import QueryGroups
from coarse_rank.gates import choose_dropout, choose_placement
from recsys.contract import Candidates, Request


def _valid_groups(n: int) -> QueryGroups:
    cands = [Candidates(np.arange(12, dtype=np.int64)) for _ in range(n)]
    return QueryGroups("valid", [Request(user_id=str(u)) for u in range(n)], cands, np.full(n, 11, np.int64))


def test_a_dropout_is_served_only_beyond_its_ci_on_the_valid_groups():
    va = _valid_groups(100)
    last = np.tile(np.arange(12, dtype=np.float64), 100)  # the label (item 11) first
    first = -last  # the label last: NDCG@10 0
    chosen, report = choose_dropout((0.0, 0.1, 0.2), [first, first, last], va, 10, seed=0)
    assert chosen == 2 and report["chosen"] == 0.2 and report["gate"]["ci95"][0] > 0
    assert report["valid_ndcg"] == {"0.0": 0.0, "0.1": 0.0, "0.2": 1.0}
    one_better = first.copy()
    one_better[11] = 100.0  # better on one group of 100 only
    chosen, report = choose_dropout((0.0, 0.1), [first, one_better], va, 10, seed=0)
    assert chosen == 0 and report["chosen"] == 0.0 and report["gate"]["challenger"] == 0.1
    chosen, report = choose_dropout((0.0, 0.1), [last, last], va, 10, seed=0)
    assert chosen == 0 and "gate" not in report  # a tie keeps no dropout



def _groups(n: int, label_is_new: bool):
    cands, labels = [], []
    for g in range(n):
        items = np.arange(10, dtype=np.int64)
        recall = np.linspace(1.0, 0.1, 10)[::-1].copy()  # recall ranks item 9 first
        cands.append(Candidates(items=items, scores={"recall": recall.astype(np.float32)}))
        labels.append(9 if label_is_new else g % 3)
    return QueryGroups("valid", [Request(user_id=f"u{g}") for g in range(n)], cands, np.array(labels))


@pytest.mark.parametrize(("label_is_new", "chosen"), [(True, "recall_place"), (False, "model")])
def test_training_serves_recall_places_only_where_they_win_on_valid(label_is_new: bool, chosen: str) -> None:
    va = _groups(60, label_is_new)
    pred = np.tile(np.arange(10, dtype=np.float64)[::-1], 60)  # the model ranks item 0 first, item 9 last
    known = np.ones(10, dtype=bool)
    known[9] = False  # item 9 has no interaction: recall's first pick, the model's last
    report = choose_placement("auto", pred, va, known, 10, seed=0)
    assert report["chosen"] == chosen and report["groups_with_new_items"] == 60
    assert (report["gate"]["ci95"][0] > 0) == (chosen == "recall_place")
    assert choose_placement("auto", pred, va, np.ones(10, dtype=bool), 10, seed=0)["chosen"] == "model"
    assert choose_placement("recall_place", pred, va, known, 10, seed=0) == {"chosen": "recall_place",
                                                                              "why": "coarse.new_items"}
