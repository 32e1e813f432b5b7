"""bench_recall at toy size: report keys and sane values (never timings); the synthetic catalog."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.recall_index import bench_recall, clustered_vectors, main


def test_clustered_vectors_are_normalised_seeded_and_clustered() -> None:
    items, sample = clustered_vectors(2000, 32, seed=0)
    assert items.shape == (2000, 32) and items.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(items, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(items, clustered_vectors(2000, 32, seed=0)[0])
    queries = sample(100, np.random.default_rng(1))
    isotropic = np.random.default_rng(0).standard_normal((2000, 32))
    isotropic /= np.linalg.norm(isotropic, axis=1, keepdims=True)
    # A query drawn from the mixture has far closer neighbours than in isotropic noise.
    assert (queries @ items.T).max(axis=1).mean() > (queries @ isotropic.T).max(axis=1).mean() + 0.15


@pytest.mark.parametrize(
    ("kind", "params"), [("hnsw", {"M": 16, "efConstruction": 40}), ("ivf", {"nlist": 64, "nprobe": 8})]
)
def test_bench_recall_reports_every_key_with_sane_values(kind: str, params: dict[str, int]) -> None:
    report = bench_recall(
        n_items=20_000, dim=16, kind=kind, n_queries=40, progress=False, n_exact_timed=20, index_params=params
    )
    expected = {
        "items", "dim", "index", "build_s", "memory_mb", "recall@100", "exact_ms_p50", "exact_ms_p99",
        "ann_ms_p50", "ann_ms_p99", "speedup_p50", "params",
    }  # fmt: skip
    assert set(report) == expected
    assert (report["items"], report["dim"], report["index"]) == (20_000, 16, kind)
    assert params.items() <= report["params"].items()
    assert 0.9 <= report["recall@100"] <= 1.0
    # at least the raw float32 vectors: 20k x 16 x 4 bytes
    assert report["memory_mb"] >= 20_000 * 16 * 4 / 2**20
    assert report["exact_ms_p99"] >= report["exact_ms_p50"] > 0
    assert report["ann_ms_p99"] >= report["ann_ms_p50"] > 0
    assert report["build_s"] > 0 and report["speedup_p50"] > 0
    json.dumps(report)  # JSON-ready


def test_flat_against_itself_has_perfect_recall_and_cli_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    main(
        ["--items", "3000", "--dim", "8", "--kind", "flat", "--queries", "10", "--k", "20", "--out", str(out)]
    )
    report = json.loads(out.read_text())
    assert report["recall@20"] == 1.0 and report["index"] == "flat"
    assert report.pop("provenance")["seeds"] == [0]  # the file says how it was made
    assert json.loads(capsys.readouterr().out) == report
