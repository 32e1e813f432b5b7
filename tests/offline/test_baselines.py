"""The popularity baseline on a hand-made split and on ML-100K."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from offline.baselines import evaluate_rankings, evaluate_rankings_per_user, popularity_rankings
from offline.protocol import make_split
from offline.schema import Vocab
from offline.split import Split


def _hand_split() -> Split:
    # train: u0 [0, 1], u1 [1, 2], u2 [1]; valid (3, 0, 2); test (2, 4, 0)
    train = pd.DataFrame({"user_idx": [0, 0, 1, 1, 2], "item_idx": [0, 1, 1, 2, 1],
                          "rating": np.ones(5, dtype=np.float32), "timestamp": [1, 2, 1, 2, 1]})
    vocab = Vocab.build(pd.Series(["a", "b", "c"]), pd.Series([f"i{i}" for i in range(5)]))
    return Split(name="hand", vocab=vocab, items=pd.DataFrame({"item_id": vocab.item_ids}),
                 users=pd.DataFrame({"user_id": vocab.user_ids}), train=train,
                 valid=np.array([3, 0, 2]), test=np.array([2, 4, 0]))


def test_popularity_valid_by_hand() -> None:
    split = _hand_split()
    # popularity on train: [1, 3, 1, 0, 0]; ties to the lower index; history excluded
    ranks = popularity_rankings(split, "valid", k=3)
    assert ranks.tolist() == [[2, 3, 4], [0, 3, 4], [0, 2, 3]]
    per_user = evaluate_rankings_per_user(split, ranks, "valid", k=3)
    np.testing.assert_allclose(per_user["ndcg@3"], [1 / math.log2(3), 1.0, 1 / math.log2(3)])
    np.testing.assert_allclose(per_user["mrr@3"], [0.5, 1.0, 0.5])


def test_popularity_test_counts_valid_items_and_pads() -> None:
    split = _hand_split()
    # popularity on train + valid: [2, 3, 2, 1, 0]; test input history = train + valid item
    ranks = popularity_rankings(split, "test", k=3)
    assert ranks.tolist() == [[2, 4, -1], [3, 4, -1], [0, 3, 4]]
    summary = evaluate_rankings(split, ranks, "test", k=3)
    assert summary["recall@3"] == pytest.approx(1.0)
    assert summary["ndcg@3"] == pytest.approx((1 + 1 / math.log2(3) + 1) / 3)
    assert summary["mrr@3"] == pytest.approx((1 + 0.5 + 1) / 3)


def test_evaluate_rankings_checks_shape_and_phase() -> None:
    split = _hand_split()
    with pytest.raises(ValueError, match="n_users=3"):
        evaluate_rankings(split, np.zeros((2, 3), dtype=np.int64), "test")
    with pytest.raises(ValueError, match="phase"):
        popularity_rankings(split, "train")


@pytest.mark.ml100k
def test_ml100k_popularity_ndcg(ml100k_dir) -> None:
    from offline.loaders import load_dataset

    split = make_split(load_dataset(ml100k_dir), k_core=5)
    summary = evaluate_rankings(split, popularity_rankings(split, "test"), "test")
    assert set(summary) == {"ndcg@10", "recall@10", "mrr@10"}
    assert 0.040 <= summary["ndcg@10"] <= 0.048
