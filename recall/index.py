"""The faiss item index behind two-tower recall: build, search, save and load.

``ItemIndex`` wraps one faiss index over L2-normalised item vectors searched by inner
product (cosine similarity), row ``i`` of the vectors being catalog item ``i``:

- ``flat``: exact search (``IndexFlatIP``); the reference every approximate index is scored against.
- ``ivf``: inverted lists (``IndexIVFFlat``, Jegou et al. 2011) with ``nlist`` ~ 4*sqrt(n)
  k-means cells, ``nprobe`` of them visited per query.
- ``hnsw``: a navigable small-world graph (``IndexHNSWFlat``, Malkov & Yashunin 2018) with
  ``M`` links per node, ``efConstruction`` / ``efSearch`` beam widths.

The default parameters reach recall@100 >= 0.95 against exact search on a clustered 1M x 64
catalog (see ``bench.recall_index``). faiss is imported inside functions, never at module import.

Deliberately left out: GPU indexes, quantised storage (PQ/SQ) and filtered search; excluded
items are removed by the caller (``recall.channels.merge_channels``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np

from recsys.digest import file_sha256
from recsys.manifest import ArtifactIntegrityError, check_file

IndexKind = Literal["flat", "ivf", "hnsw"]
INDEX_FILE = "index.faiss"
META_FILE = "index.json"

# Defaults per kind; build(**params) overrides them. HNSW tuned on the clustered 1M x 64
# benchmark (recall@100 vs exact, 300 queries): M=32/efC=80/efS=192 -> 0.971 at ~0.5 ms a
# query vs ~7-18 ms exact; M=32/efC=40 needs efS=256 for 0.960 and saves little build time;
# M=16/efC=64 stays at 0.943 even with efS=320. On 2 cores IVF builds in ~12-40 s where HNSW
# takes ~260 s, at half the memory and a faster query: prefer "ivf" for big catalogs here.
DEFAULT_PARAMS: dict[str, dict[str, Any]] = {
    "flat": {},
    # nlist None -> 4*sqrt(n) cells; train_size None -> 40 points per cell (faiss asks >= 39)
    # 1M x 64 (4000 cells): nprobe 32 -> recall@100 0.940, 48 -> 0.965 (0.27 ms), 64 -> 0.979 (0.33 ms)
    "ivf": {"nlist": None, "nprobe": 48, "train_size": None},
    "hnsw": {"M": 32, "efConstruction": 80, "efSearch": 192},
}
# faiss class name -> our kind, to check that a loaded index is what its meta says.
_FAISS_CLASS = {"flat": "IndexFlatIP", "ivf": "IndexIVFFlat", "hnsw": "IndexHNSWFlat"}


class IndexArtifactError(ValueError):
    """A saved index is missing, corrupt (its digest differs from ``index.json``'s), or disagrees with its metadata."""


# OpenMP pays off only for big jobs: faiss splits even a single query's scan across threads,
# and the fork/join costs more than it saves (measured on 2 cores: flat search over 100k
# items 0.7 ms on one thread vs 15 ms on two; HNSW search 0.23 vs 0.39 ms; an HNSW build of
# 4k items 1.3 s vs 3.8 s with the cores shared). One thread also makes small builds
# deterministic (HNSW insertion order).
PARALLEL_SEARCH_FROM = 16  # queries
PARALLEL_BUILD_FROM = 50_000  # vectors


@contextlib.contextmanager
def _faiss(rows: int = 0, parallel_from: int = 0) -> Iterator[Any]:
    """The faiss module, with this thread's OpenMP width set for a job of ``rows`` rows.

    Jobs of at least ``parallel_from`` rows use one thread per core this process may run
    on (faiss would otherwise start one per host core); smaller ones use one thread. The
    previous width is restored on exit: faiss and torch share libgomp, so leaving it at 1
    would silently make every later torch op (the LLM stage's forward) single-threaded.
    """
    import faiss  # lazy: imports faiss

    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(len(os.sched_getaffinity(0)) if rows >= parallel_from else 1)
    try:
        yield faiss
    finally:
        faiss.omp_set_num_threads(before)


def _build(faiss: Any, x: np.ndarray, kind: str, p: dict[str, Any], seed: int) -> tuple[Any, dict[str, Any], float]:
    """A filled ``kind`` index over ``x``, its final params and the build seconds."""
    n, d = x.shape
    t0 = time.perf_counter()
    if kind == "flat":
        index = faiss.IndexFlatIP(d)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, int(p["M"]), faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = int(p["efConstruction"])
    else:
        # Fewer cells than 39 points each makes k-means degenerate (faiss warns below that).
        p["nlist"] = int(p["nlist"] or max(1, min(round(4 * math.sqrt(n)), n // 39)))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, p["nlist"], faiss.METRIC_INNER_PRODUCT)
        p["train_size"] = int(p["train_size"] or 40 * p["nlist"])
        rng = np.random.default_rng(seed)
        sample = x if n <= p["train_size"] else x[np.sort(rng.choice(n, p["train_size"], replace=False))]
        index.cp.seed = seed
        index.cp.spherical = True  # unit-norm centroids: cells by cosine, matching the metric
        index.train(sample)
    index.add(x)
    _apply_search_params(index, kind, p)
    return index, p, time.perf_counter() - t0


def _as_matrix(x: np.ndarray, name: str, dim: int | None = None) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"{name} must be a 2-d (rows, dim) array, got shape {x.shape}")
    if dim is not None and x.shape[1] != dim:
        raise ValueError(f"{name} has dimension {x.shape[1]}, the index has {dim}")
    if not np.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return x


def _apply_search_params(index: Any, kind: str, params: dict[str, Any]) -> None:
    if kind == "ivf":
        index.nprobe = int(params["nprobe"])
    elif kind == "hnsw":
        index.hnsw.efSearch = int(params["efSearch"])


class ItemIndex:
    """A faiss inner-product index over item vectors; ids are row numbers (item indices).

    Built offline by ``recall.train`` (or ``build``), loaded once by the recall stage's
    ``load``, searched on the request thread.
    """

    def __init__(self, index: Any, kind: str, params: dict[str, Any], build_s: float = 0.0) -> None:
        self._index = index
        self.kind = kind
        self.params = params
        self.build_s = build_s

    @property
    def ntotal(self) -> int:
        return int(self._index.ntotal)

    @property
    def dim(self) -> int:
        return int(self._index.d)

    @classmethod
    def build(
        cls, vectors: np.ndarray, kind: IndexKind = "flat", metric: str = "ip", seed: int = 0, **params: Any
    ) -> ItemIndex:
        """Index ``vectors`` (n, d); row i gets id i. Unknown ``params`` raise ValueError."""
        if metric != "ip":
            raise ValueError(f"metric {metric!r} is not supported; only 'ip' (inner product)")
        if kind not in DEFAULT_PARAMS:
            raise ValueError(f"index kind {kind!r} is not one of {sorted(DEFAULT_PARAMS)}")
        unknown = set(params) - set(DEFAULT_PARAMS[kind])
        if unknown:
            raise ValueError(
                f"unknown {kind} index params {sorted(unknown)}; known: {sorted(DEFAULT_PARAMS[kind])}"
            )
        x = _as_matrix(vectors, "vectors")
        n, d = x.shape
        if n == 0:
            raise ValueError("cannot build an index over 0 vectors")
        p = {**DEFAULT_PARAMS[kind], **params}
        with _faiss(n, PARALLEL_BUILD_FROM) as faiss:
            index, p, build_s = _build(faiss, x, kind, p, seed)
        return cls(index, kind, p, build_s=build_s)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` (scores (m, k) float32, ids (m, k) int64) per query, best first.

        Where fewer than ``k`` items are found, ids are -1 and scores -inf.
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        q = _as_matrix(queries, "queries", self.dim)
        with _faiss(len(q), PARALLEL_SEARCH_FROM):
            scores, ids = self._index.search(q, k)
        ids = ids.astype(np.int64, copy=False)
        scores = np.where(ids < 0, -np.inf, scores).astype(np.float32, copy=False)
        return scores, ids

    def nbytes(self) -> int:
        """Size of the serialised index in bytes (vectors + graph / lists)."""
        with _faiss() as faiss:
            return int(faiss.serialize_index(self._index).nbytes)

    def save(self, directory: Path) -> None:
        """Write ``index.faiss`` and ``index.json`` into ``directory``.

        Each file is written to a temporary name and renamed into place, the index first;
        the meta records the index file's sha256, so a reader never accepts a torn pair.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tmp_index = directory / f".{INDEX_FILE}.tmp{os.getpid()}"
        tmp_meta = directory / f".{META_FILE}.tmp{os.getpid()}"
        try:
            with _faiss() as faiss:
                faiss.write_index(self._index, str(tmp_index))
            meta = {
                "kind": self.kind,
                "metric": "ip",
                "n": self.ntotal,
                "d": self.dim,
                "params": self.params,
                "build_s": round(self.build_s, 3),
                "sha256": file_sha256(tmp_index),
            }
            tmp_meta.write_text(json.dumps(meta, indent=2))
            os.replace(tmp_index, directory / INDEX_FILE)
            os.replace(tmp_meta, directory / META_FILE)
        finally:  # a failed save leaves no temporary files behind
            tmp_index.unlink(missing_ok=True)
            tmp_meta.unlink(missing_ok=True)

    @classmethod
    def load(cls, directory: Path) -> ItemIndex:
        """Read an index saved by ``save``; raises IndexArtifactError naming the bad file."""
        directory = Path(directory)
        index_path, meta_path = directory / INDEX_FILE, directory / META_FILE
        for path in (index_path, meta_path):
            if not path.is_file():
                raise IndexArtifactError(f"index file {path} is missing")
        try:
            meta = json.loads(meta_path.read_text())
            kind, n, d, params = meta["kind"], int(meta["n"]), int(meta["d"]), dict(meta["params"])
        except (ValueError, KeyError, TypeError) as e:
            raise IndexArtifactError(f"index meta {meta_path} is corrupt: {e}") from e
        if kind not in _FAISS_CLASS:
            raise IndexArtifactError(f"index meta {meta_path} names unknown kind {kind!r}")
        try:  # before faiss parses a byte of it (recsys.manifest: the one digest check)
            check_file(index_path, meta.get("sha256"), meta_path)
        except ArtifactIntegrityError as e:
            raise IndexArtifactError(str(e)) from e
        try:
            with _faiss() as faiss:
                index = faiss.read_index(str(index_path))
        except RuntimeError as e:
            raise IndexArtifactError(f"index file {index_path} is corrupt: {e}") from e
        found = (type(index).__name__, int(index.ntotal), int(index.d))
        if found != (_FAISS_CLASS[kind], n, d):
            raise IndexArtifactError(
                f"index file {index_path} holds {found} but {meta_path} says {(_FAISS_CLASS[kind], n, d)}"
            )
        _apply_search_params(index, kind, params)
        return cls(index, kind, params, build_s=float(meta.get("build_s", 0.0)))


def recall_against_exact(index: ItemIndex, exact: ItemIndex, queries: np.ndarray, k: int) -> float:
    """Mean share of the exact top-``k`` ids that ``index`` also returns (recall@k vs exact).

    Example: exact top-2 {3, 5}, approximate top-2 {5, 8} -> 0.5.
    """
    _, approx_ids = index.search(queries, k)
    _, exact_ids = exact.search(queries, k)
    return overlap_at_k(approx_ids, exact_ids)


def overlap_at_k(approx_ids: np.ndarray, exact_ids: np.ndarray) -> float:
    """Mean per-row share of ``exact_ids`` (excluding -1 padding) found in ``approx_ids``."""
    shares = []
    for got, want in zip(approx_ids, exact_ids, strict=True):
        want = want[want >= 0]
        if len(want):
            shares.append(len(np.intersect1d(got[got >= 0], want)) / len(want))
    return float(np.mean(shares)) if shares else 1.0
