"""Counts merged from Ray Data partitions equal the single-process builders' bit for bit."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from offline import distributed_counts, item_neighbours

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def zipf_sequences(n_users: int, n_items: int, seed: int = 0) -> list[np.ndarray]:
    """Users with 0-30 events over a Zipf-skewed catalog, repeats included (pairs tie often)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, n_items + 1)
    return [rng.choice(n_items, size=rng.integers(0, 30), p=p / p.sum()) for _ in range(n_users)]


def assert_same(a, b) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    a, b = a.tocsr(), b.tocsr()
    a.sort_indices()
    b.sort_indices()
    np.testing.assert_array_equal(a.indptr, b.indptr)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.data, b.data)


def test_cuts_cover_every_user_once() -> None:
    assert distributed_counts.even_cuts(5, 5) == [0, 1, 2, 3, 4, 5]
    frames = distributed_counts.user_partitions([np.arange(2), np.arange(3), np.arange(1)], [0, 2, 2, 3])
    assert [len(f) for f in frames] == [2, 1]  # the empty run is no partition


@pytest.mark.parametrize("chunk_pairs", [50, item_neighbours.PAIR_CHUNK])
def test_covisitation_equals_single_process(local_ray, chunk_pairs) -> None:
    seqs = zipf_sequences(300, 40)
    kw = {"window": 4, "backward": 0.5, "top_k": 15}
    single = item_neighbours.covisitation(seqs, 40, **kw)
    assert single.nnz > 0
    assert_same(distributed_counts.covisitation(seqs, 40, chunk_pairs=chunk_pairs, **kw), single)


def test_covisitation_prunes_as_the_single_process_build(local_ray) -> None:
    # a cut while accumulating: both builds cut after the same chunks, so they still agree
    seqs = zipf_sequences(200, 60, seed=1)
    kw = {"window": 3, "top_k": 5, "chunk_pairs": 400, "max_entries": 300}
    assert_same(distributed_counts.covisitation(seqs, 60, **kw), item_neighbours.covisitation(seqs, 60, **kw))


def test_cooccurrence_is_the_gram_matrix(local_ray) -> None:
    seqs = zipf_sequences(120, 25, seed=2)
    x = item_neighbours.user_item_matrix(seqs, 25)
    assert_same(distributed_counts.cooccurrence(seqs, 25, partitions=3), (x.T @ x).tocsr())


@pytest.mark.parametrize("kind", ["ease", "knn"])
def test_item_model_equals_single_process(local_ray, kind) -> None:
    seqs = zipf_sequences(250, 50, seed=3)
    kw = {"kind": kind, "top_k": 10, "l2": 50.0, "shrink": 5.0, "max_dense": 1000}
    got_kind, got = distributed_counts.item_model(seqs, 50, partitions=3, **kw)
    want_kind, want = item_neighbours.item_model(seqs, 50, **kw)
    assert got_kind == want_kind == kind
    assert_same(got, want)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="window"):
        distributed_counts.covisitation([np.arange(3)], 3, window=0)
    with pytest.raises(ValueError, match="partitions"):
        distributed_counts.cooccurrence([np.arange(3)], 3, partitions=0)


def test_recall_channels_fitted_inside_a_ray_session_are_counted_there_and_equal(local_ray, monkeypatch) -> None:
    from recall.config import RecallConfig
    from recall.extra_channels import fit_channels
    from recsys import cluster

    seqs, config = zipf_sequences(300, 60, seed=3), RecallConfig(item_model="ease")
    called = []
    real = distributed_counts.covisitation
    monkeypatch.setattr(distributed_counts, "covisitation", lambda *a, **k: called.append(1) or real(*a, **k))
    on_cluster = fit_channels(seqs, 60, config)
    assert called == [1] and cluster.connected()
    monkeypatch.setattr(cluster, "connected", lambda: False)  # as outside any session
    monkeypatch.setattr("recall.extra_channels.connected", lambda: False)
    here = fit_channels(seqs, 60, config)
    assert called == [1] and set(here) == set(on_cluster) == {"covisit", "item_model"}
    for name in here:
        assert here[name][0] == on_cluster[name][0] and here[name][2] == on_cluster[name][2]
        assert_same(here[name][1], on_cluster[name][1])
