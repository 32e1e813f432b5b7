"""ItemIndex: exact flat search, approximate kinds vs exact, padding, save/load round trip, load errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from bench.recall_index import clustered_vectors
from recall.index import IndexArtifactError, ItemIndex, overlap_at_k, recall_against_exact

KINDS = ["flat", "ivf", "hnsw"]


@pytest.fixture(scope="module")
def catalog() -> tuple[np.ndarray, np.ndarray]:
    items, sample = clustered_vectors(4000, 32, seed=3)
    return items, sample(50, np.random.default_rng(4))


def test_flat_search_equals_numpy_brute_force(catalog: tuple[np.ndarray, np.ndarray]) -> None:
    items, queries = catalog
    scores, ids = ItemIndex.build(items, "flat").search(queries, 10)
    dots = queries @ items.T
    want = np.argsort(-dots, axis=1, kind="stable")[:, :10]
    np.testing.assert_array_equal(ids, want)
    np.testing.assert_allclose(scores, np.take_along_axis(dots, want, axis=1), rtol=1e-5)
    assert ids.dtype == np.int64 and scores.dtype == np.float32


def test_flat_search_on_hand_made_vectors() -> None:
    items = np.array([[1, 0], [0, 1], [0.6, 0.8]], dtype=np.float32)
    scores, ids = ItemIndex.build(items).search(np.array([[0.0, 1.0]], dtype=np.float32), 2)
    assert ids.tolist() == [[1, 2]]
    np.testing.assert_allclose(scores, [[1.0, 0.8]], rtol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_pads_with_minus_one_and_minus_inf_when_k_exceeds_items(kind: str) -> None:
    items = np.eye(3, 4, dtype=np.float32)
    scores, ids = ItemIndex.build(items, kind).search(items[:1], 5)  # type: ignore[arg-type]
    assert ids[0, 0] == 0 and sorted(ids[0, :3].tolist()) == [0, 1, 2]
    assert ids[0, 3:].tolist() == [-1, -1]
    assert np.isneginf(scores[0, 3:]).all() and np.isfinite(scores[0, :3]).all()


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_approximate_kinds_recall_against_exact(kind: str, catalog: tuple[np.ndarray, np.ndarray]) -> None:
    items, queries = catalog
    exact = ItemIndex.build(items, "flat")
    approx = ItemIndex.build(items, kind)  # type: ignore[arg-type]
    assert recall_against_exact(approx, exact, queries, 50) >= 0.9
    assert recall_against_exact(exact, exact, queries, 50) == 1.0


def test_overlap_at_k_by_hand() -> None:
    assert overlap_at_k(np.array([[5, 8]]), np.array([[3, 5]])) == 0.5
    # padding in the exact list is not counted as a miss
    assert overlap_at_k(np.array([[1, -1], [2, 9]]), np.array([[1, -1], [4, 2]])) == 0.75


@pytest.mark.parametrize("kind", KINDS)
def test_save_load_round_trip_gives_identical_results(
    kind: str, catalog: tuple[np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    items, queries = catalog
    index = ItemIndex.build(items, kind)  # type: ignore[arg-type]
    index.save(tmp_path)
    loaded = ItemIndex.load(tmp_path)
    assert (loaded.kind, loaded.ntotal, loaded.dim) == (kind, len(items), items.shape[1])
    assert loaded.params == index.params
    for got, want in zip(loaded.search(queries, 20), index.search(queries, 20), strict=True):
        np.testing.assert_array_equal(got, want)
    meta = json.loads((tmp_path / "index.json").read_text())
    assert meta["kind"] == kind and meta["n"] == len(items) and meta["d"] == items.shape[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.faiss", "index.json"]  # no temp files left


def test_load_errors_name_the_bad_file(catalog: tuple[np.ndarray, np.ndarray], tmp_path: Path) -> None:
    with pytest.raises(IndexArtifactError, match="index.faiss is missing"):
        ItemIndex.load(tmp_path)
    ItemIndex.build(catalog[0][:100], "flat").save(tmp_path)
    raw = (tmp_path / "index.faiss").read_bytes()
    (tmp_path / "index.faiss").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(IndexArtifactError, match=r"index\.faiss: damaged"):
        ItemIndex.load(tmp_path)
    (tmp_path / "index.json").write_text("{not json")
    with pytest.raises(IndexArtifactError, match=r"index\.json is corrupt"):
        ItemIndex.load(tmp_path)


def test_load_rejects_a_truncated_index_even_with_matching_checksum(
    catalog: tuple[np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    ItemIndex.build(catalog[0][:100], "hnsw").save(tmp_path)
    raw = (tmp_path / "index.faiss").read_bytes()
    (tmp_path / "index.faiss").write_bytes(raw[:64])
    meta = json.loads((tmp_path / "index.json").read_text())
    meta["sha256"] = hashlib.sha256(raw[:64]).hexdigest()
    (tmp_path / "index.json").write_text(json.dumps(meta))
    with pytest.raises(IndexArtifactError, match=r"index\.faiss is corrupt"):
        ItemIndex.load(tmp_path)


def test_load_rejects_meta_that_disagrees_with_the_index(
    catalog: tuple[np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    ItemIndex.build(catalog[0][:100], "flat").save(tmp_path)
    meta = json.loads((tmp_path / "index.json").read_text())
    meta["n"] = 99
    (tmp_path / "index.json").write_text(json.dumps(meta))
    with pytest.raises(IndexArtifactError, match="says"):
        ItemIndex.load(tmp_path)


def test_bad_inputs_raise_with_the_offending_value() -> None:
    items = np.eye(4, dtype=np.float32)
    with pytest.raises(ValueError, match="'annoy'"):
        ItemIndex.build(items, "annoy")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="efSearch"):
        ItemIndex.build(items, "flat", efSearch=10)
    with pytest.raises(ValueError, match="'l2'"):
        ItemIndex.build(items, metric="l2")
    index = ItemIndex.build(items)
    with pytest.raises(ValueError, match="dimension 3"):
        index.search(np.ones((1, 3), dtype=np.float32), 2)
    with pytest.raises(ValueError, match="k must be >= 1, got 0"):
        index.search(items, 0)


def test_index_calls_leave_torch_thread_count_alone(tmp_path):
    """faiss and torch share libgomp: a one-thread search must not make torch single-threaded."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = np.random.default_rng(0).normal(size=(64, 8)).astype(np.float32)
        index = ItemIndex.build(x, "flat")
        index.search(x[:1], 5)
        index.save(tmp_path)
        ItemIndex.load(tmp_path)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
