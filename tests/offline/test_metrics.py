"""Ranking metrics against hand computations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from offline.metrics import (
    candidate_recall,
    coverage,
    intra_list_diversity,
    ndcg_at_ranks,
    novelty,
    per_user_metrics,
    random_ndcg,
    rank_full,
    summarize,
)


def test_per_user_metrics_by_hand() -> None:
    rankings = np.array([
        [7, 1, 2, 3],    # target 7 at rank 0
        [1, 2, 7, 3],    # rank 2
        [1, 2, 3, 7],    # rank 3: beyond k=3
        [1, -1, -1, -1],  # padding, miss
        [5, 5, 4, -1],   # duplicate entries: first hit at rank 2
    ])
    m = per_user_metrics(rankings, np.array([7, 7, 7, 7, 4]), k=3)
    assert set(m) == {"ndcg@3", "recall@3", "mrr@3"}
    np.testing.assert_allclose(m["ndcg@3"], [1.0, 0.5, 0.0, 0.0, 0.5])
    np.testing.assert_allclose(m["recall@3"], [1, 1, 0, 0, 1])
    np.testing.assert_allclose(m["mrr@3"], [1.0, 1 / 3, 0.0, 0.0, 1 / 3])
    assert m["ndcg@3"].dtype == np.float64
    s = summarize(m)
    assert s["ndcg@3"] == pytest.approx(0.4) and s["recall@3"] == pytest.approx(0.6)


def test_per_user_metrics_shorter_lists_and_bad_input() -> None:
    m = per_user_metrics(np.array([[3, 9]]), np.array([9]), k=10)  # K=2 < k
    assert m["ndcg@10"][0] == pytest.approx(1 / math.log2(3))
    with pytest.raises(ValueError, match="targets must be"):
        per_user_metrics(np.array([[1, 2]]), np.array([1, 2]))
    with pytest.raises(ValueError, match=">= 0"):
        per_user_metrics(np.array([[1, 2]]), np.array([-1]))
    with pytest.raises(ValueError, match="no users"):
        summarize({"ndcg@10": np.zeros(0)})


def test_candidate_recall_matrix_and_ragged() -> None:
    assert candidate_recall(np.array([[1, 2], [3, 4], [5, -1]]), np.array([2, 9, 5])) == pytest.approx(2 / 3)
    ragged = [np.array([1, 2, 3]), np.array([4]), np.zeros(0, dtype=np.int64), np.array([8, 9])]
    assert candidate_recall(ragged, np.array([3, 5, 0, 8])) == 0.5
    with pytest.raises(ValueError, match="2 candidate lists for 3 targets"):
        candidate_recall([np.array([1]), np.array([2])], np.array([1, 2, 3]))


def test_coverage_counts_distinct_items_in_top_k() -> None:
    rankings = np.array([[0, 1, 9], [1, 2, 8], [-1, -1, -1]])
    assert coverage(rankings, n_items=10, k=2) == pytest.approx(0.3)  # {0, 1, 2}
    assert coverage(rankings, n_items=10, k=3) == pytest.approx(0.5)


def test_novelty_self_information() -> None:
    pop = np.array([4.0, 2.0, 1.0, 1.0])  # shares 1/2, 1/4, 1/8, 1/8 -> 1, 2, 3, 3 bits
    rankings = np.array([[0, 1], [2, -1], [-1, -1]])
    # user 0: (1 + 2) / 2 = 1.5; user 1: 3; user 2 is all padding and skipped
    assert novelty(rankings, pop, k=2, smoothing=0.0) == pytest.approx(2.25)
    # Laplace: shares (5, 3, 2, 2) / 12
    expected = ((-math.log2(5 / 12) - math.log2(3 / 12)) / 2 - math.log2(2 / 12)) / 2
    assert novelty(rankings, pop, k=2) == pytest.approx(expected)
    assert novelty(np.array([[3]]), np.array([1.0, 0.0, 0.0, 0.0]), smoothing=0.0) == math.inf


def test_intra_list_diversity_vectors_and_categories() -> None:
    vecs = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0]])
    # list [0, 1, 2]: pairs (0,1) dist 1, (0,2) dist 0, (1,2) dist 1 -> 2/3; list [0, 2, -1]: 0
    rankings = np.array([[0, 1, 2], [0, 2, -1], [1, -1, -1]])
    assert intra_list_diversity(rankings, vecs) == pytest.approx(1 / 3)  # user 3 has < 2 items
    cats = [["drama", "war"], ["drama"], [], []]
    # (0,1): 1 - 1/2; (0,2): 1; (1,2): 1 -> 2.5/3; [2, 3]: both empty -> 0
    assert intra_list_diversity(np.array([[0, 1, 2], [2, 3, -1]]), cats) == pytest.approx((2.5 / 3 + 0) / 2)
    with pytest.raises(ValueError, match="two items"):
        intra_list_diversity(np.array([[0, -1]]), vecs)


def test_rank_full_excludes_history_and_breaks_ties_by_index() -> None:
    scores = np.array([
        [0.1, 0.9, 0.5, 0.9, 0.5, 0.2],
        [1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
    ])
    out = rank_full(scores, [np.array([3]), np.array([0, 4])], k=3)
    assert out.tolist() == [[1, 2, 4], [1, 2, 3]]
    assert out.dtype == np.int64
    assert scores[0, 3] == 0.9  # the input is not modified


def test_rank_full_pads_when_too_few_items() -> None:
    out = rank_full(np.array([[0.3, 0.1, 0.2]]), [np.array([0, 2])], k=4)
    assert out.tolist() == [[1, -1, -1, -1]]
    with pytest.raises(ValueError, match="NaN"):
        rank_full(np.array([[np.nan, 1.0]]), [np.zeros(0, dtype=np.int64)], k=1)
    with pytest.raises(ValueError, match="1 exclude lists for 2"):
        rank_full(np.zeros((2, 3)), [np.zeros(0, dtype=np.int64)], k=1)


def test_rank_full_matches_full_sort_on_random_ties() -> None:
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 4, size=(50, 30)).astype(float)  # many ties
    exclude = [rng.choice(30, size=rng.integers(0, 10), replace=False) for _ in range(50)]
    out = rank_full(scores, exclude, k=7)
    for row, ex in enumerate(exclude):
        allowed = np.setdiff1d(np.arange(30), ex)
        ref = allowed[np.lexsort((allowed, -scores[row, allowed]))][:7]
        assert out[row].tolist() == ref.tolist()


def test_ndcg_at_ranks_by_hand_and_as_per_user_metrics_computes_it() -> None:
    np.testing.assert_allclose(ndcg_at_ranks(np.array([0, 1, 2, 3, -1]), k=3), [1.0, 1 / math.log2(3), 0.5, 0.0, 0.0])
    rng = np.random.default_rng(0)
    rankings = rng.integers(-1, 30, size=(500, 12))
    targets = rng.integers(0, 30, size=500)
    for k in (1, 5, 12):
        hits = rankings[:, :k] == targets[:, None]
        ranks = np.where(hits.any(axis=1), hits.argmax(axis=1), -1)
        assert np.array_equal(ndcg_at_ranks(ranks, k), per_user_metrics(rankings, targets, k)[f"ndcg@{k}"])
    with pytest.raises(ValueError, match="k must be >= 1"):
        ndcg_at_ranks(np.array([0]), k=0)


def test_random_ndcg_is_the_mean_over_every_place_of_the_target() -> None:
    for k in (1, 3, 10):
        n = np.arange(0, 25)
        brute = [float(np.mean(ndcg_at_ranks(np.arange(m), k))) if m else 0.0 for m in n]
        np.testing.assert_allclose(random_ndcg(n, k), brute, rtol=1e-12)
    assert random_ndcg(np.array([3]), k=10)[0] == sum(1.0 / np.log2(r + 2) for r in range(3)) / 3
    with pytest.raises(ValueError, match="n_candidates must be >= 0"):
        random_ndcg(np.array([-1]))
