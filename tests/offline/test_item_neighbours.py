"""Item-to-item matrices and the neighbour channel, values worked out by hand."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

from offline import item_neighbours
from offline.item_neighbours import NeighbourChannel, covisitation, ease, item_knn, item_model, top_k_rows


def arr(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=np.int64)


def test_docstring_examples() -> None:
    assert doctest.testmod(item_neighbours).failed == 0


def test_covisitation_counts_by_hand() -> None:
    # user 0: 0 1 2 0 (item 0 twice), user 1: 2 1. window 2, backward 0.5, pair weight 1/distance.
    w = covisitation([arr(0, 1, 2, 0), arr(2, 1)], 3, window=2, backward=0.5).toarray()
    # u0 distance 1: 0->1, 1->2, 2->0 weigh 1 (and 1->0, 2->1, 0->2 weigh .5 backward);
    # u0 distance 2: 0->2, 1->0 weigh .5 (2->0, 0->1 weigh .25); u1: 2->1 weighs 1 (1->2 .5)
    expected = np.array([
        [0.0, 1.0 + 0.25, 0.5 + 0.5],
        [0.5 + 0.5, 0.0, 1.0 + 0.5],
        [1.0 + 0.25, 0.5 + 1.0, 0.0],
    ])
    np.testing.assert_allclose(w, expected, rtol=1e-6)
    # nothing across users: with window 5 the pair (u0's last 0, u1's first 2) still is not counted
    wide = covisitation([arr(0), arr(2)], 3, window=5).toarray()
    assert wide.sum() == 0.0


def test_covisitation_rejects_bad_window_and_prunes_rows() -> None:
    with pytest.raises(ValueError, match="window must be >= 1, got 0"):
        covisitation([arr(0, 1)], 2, window=0)
    w = covisitation([arr(0, 1, 2, 3)], 4, window=3, backward=0.0, top_k=1).toarray()
    assert w.tolist() == [[0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]]


@pytest.mark.parametrize("chunk_pairs", [1, 37, 1000])
def test_covisitation_in_user_chunks_is_the_same_matrix(chunk_pairs: int) -> None:
    rng = np.random.default_rng(chunk_pairs)
    seqs = [rng.integers(0, 40, size=rng.integers(0, 30)) for _ in range(150)]
    whole = covisitation(seqs, 40, window=3, top_k=8, chunk_pairs=10**9)
    chunked = covisitation(seqs, 40, window=3, top_k=8, chunk_pairs=chunk_pairs)
    assert whole.nnz == 40 * 8 and (whole != chunked).nnz == 0


def test_covisitation_pruned_while_accumulating_keeps_each_rows_leader() -> None:
    # item 0 is followed by 1 in every sequence, by 2..9 once each: 1 leads row 0 in any chunking
    seqs = [arr(0, 1)] * 30 + [arr(0, k) for k in range(2, 10)]
    pruned = covisitation(seqs, 10, window=1, backward=0.0, top_k=1, chunk_pairs=2, max_entries=3)
    assert pruned[0].indices.tolist() == [1] and pruned[0].data.tolist() == [30.0]
    with pytest.raises(ValueError, match="chunk_pairs"):
        covisitation(seqs, 10, chunk_pairs=0)


def test_top_k_rows_breaks_ties_to_the_lower_column() -> None:
    got = top_k_rows(np.array([[1.0, 2.0, 2.0, 2.0]]), 2).toarray()
    assert got.tolist() == [[0.0, 2.0, 2.0, 0.0]]
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        top_k_rows(np.eye(2), 0)


def test_item_knn_cosine_with_shrink() -> None:
    # users {0,1}, {0,1,2}, {2}: |U0|=2, |U1|=2, |U2|=2; U0&U1=2, U0&U2=1, U1&U2=1
    w = item_knn([arr(0, 1), arr(0, 1, 2), arr(2)], 3, shrink=1.0).toarray()
    np.testing.assert_allclose(w, [[0, 2 / 3, 1 / 3], [2 / 3, 0, 1 / 3], [1 / 3, 1 / 3, 0]], rtol=1e-6)
    assert item_knn([arr(0, 1), arr(0, 1, 2), arr(2)], 3, shrink=1.0, top_k=1).nnz == 3


def test_ease_closed_form_by_hand() -> None:
    # X = [[1,1],[1,0]]: G + I = [[3,1],[1,2]], P = 1/5 [[2,-1],[-1,3]], B_ij = -P_ij / P_jj
    w = ease([arr(0, 1), arr(0)], 2, l2=1.0).toarray()
    np.testing.assert_allclose(w, [[0.0, 1 / 3], [1 / 2, 0.0]], rtol=1e-5)


def test_item_model_falls_back_to_knn_above_the_dense_limit() -> None:
    seqs = [arr(0, 1), arr(0, 1, 2), arr(2)]
    kind, w = item_model(seqs, 3, kind="ease", top_k=5, l2=1.0, shrink=1.0, max_dense=2)
    assert kind == "knn"
    np.testing.assert_allclose(w.toarray(), item_knn(seqs, 3, shrink=1.0).toarray())
    assert item_model(seqs, 3, kind="ease", top_k=5, l2=1.0, shrink=1.0, max_dense=3)[0] == "ease"
    with pytest.raises(ValueError, match="'ease' or 'knn'"):
        item_model(seqs, 3, kind="svd", top_k=5, l2=1.0, shrink=1.0, max_dense=3)


def test_neighbour_channel_decays_recent_items_and_excludes() -> None:
    w = np.zeros((5, 5), np.float32)
    w[2, 4], w[3, 4], w[3, 0], w[1, 0] = 1.0, 1.0, 4.0, 9.0
    channel = NeighbourChannel("covisit", w, last_n=2)
    # history ... 1, 3, 2: the last two are 2 (weight 1) and 3 (weight 1/2); item 1 is out of reach
    scores = channel.scores(arr(1, 3, 2))
    np.testing.assert_allclose(scores, [2.0, 0.0, 0.0, 0.0, 1.5])
    ids, s = channel.candidates(arr(1, 3, 2), exclude=arr(1, 3, 2), n=5)
    assert ids.tolist() == [0, 4] and s.tolist() == [2.0, 1.5]
    assert channel.candidates(arr(1, 3, 2), exclude=arr(0), n=5)[0].tolist() == [4]
    assert channel.candidates(arr(1, 3, 2), exclude=arr(), n=1)[0].tolist() == [0]
    # an item seen twice counts once, at its latest position: 3 is the most recent here
    np.testing.assert_allclose(NeighbourChannel("c", w, 2).scores(arr(3, 2, 3)), [4.0, 0, 0, 0, 1.5])
    # whole history, weight 1 each
    np.testing.assert_allclose(NeighbourChannel("m", w, None).scores(arr(1, 3, 2, 3)), [13.0, 0, 0, 0, 2.0])
    assert NeighbourChannel("m", w, None).candidates(arr(), arr(), 3)[0].tolist() == []


def test_neighbour_channel_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="square"):
        NeighbourChannel("x", np.zeros((2, 3)), None)
    with pytest.raises(ValueError, match="last_n must be >= 1"):
        NeighbourChannel("x", np.zeros((2, 2)), 0)


@pytest.mark.parametrize("last_n", [None, 1, 10, 50])
def test_neighbour_scores_are_bit_for_bit_the_sparse_product(last_n: int | None) -> None:
    rng = np.random.default_rng(7)
    n = 300
    w = top_k_rows(rng.random((n, n)).astype(np.float32) * (rng.random((n, n)) < 0.2), 40)
    channel = NeighbourChannel("c", w, last_n)
    for length in (0, 1, 7, 60, 400):
        history = rng.integers(-2, n + 2, length)  # out-of-catalog ids are ignored by both
        reference = (channel.query(history) @ channel.weights).toarray().ravel().astype(np.float32)
        got = channel.scores(history)
        assert got.dtype == np.float32 and got.tobytes() == reference.tobytes()
