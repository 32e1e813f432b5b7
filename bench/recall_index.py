"""Recall scale benchmark: approximate vs exact faiss search on a synthetic catalog.

``bench_recall`` draws clustered item vectors of the two-tower dimension (a Gaussian mixture
with Zipf-sized clusters of varying spread, L2-normalised, as trained item embeddings are:
genres/topics form clusters of very different sizes), queries from the same mixture, and
reports build time, index memory, recall@k of the approximate index against exact search,
and single-query latency (one query per call, as the serving path searches) for both.
Exact latency is timed on at most ``n_exact_timed`` queries to keep a 1M run short; the
exact top-k for the recall figure comes from one batched exact search.

Run: ``python -m bench.recall_index --items 1000000 --kind hnsw --out results/bench/recall_ann_1m_hnsw.json``.

Deliberately left out: real embeddings (their scale is ML-100K's ~1.6k items, far below what
an ANN index is for) and multi-threaded batch throughput.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from recall.index import ItemIndex, overlap_at_k
from recsys.progress import progress_bar
from recsys.provenance import write_result


def clustered_vectors(n: int, dim: int, seed: int, n_clusters: int | None = None) -> tuple[np.ndarray, Any]:
    """``n`` L2-normalised float32 vectors from a Gaussian mixture, plus a sampler for more.

    Cluster sizes follow a Zipf law (weight ~ 1/rank^0.8), each cluster has its own spread in
    [0.35, 0.8] around a N(0, I/dim)-scaled unit-ish center. The returned ``sample(m, rng)``
    draws further vectors (queries) from the same mixture.
    """
    if n < 1 or dim < 1:
        raise ValueError(f"need n >= 1 and dim >= 1, got n={n}, dim={dim}")
    rng = np.random.default_rng(seed)
    n_clusters = n_clusters or max(4, int(np.sqrt(n)))
    centers = rng.standard_normal((n_clusters, dim), dtype=np.float32) / np.float32(np.sqrt(dim))
    weights = 1.0 / np.arange(1, n_clusters + 1) ** 0.8
    weights /= weights.sum()
    spread = rng.uniform(0.35, 0.8, n_clusters).astype(np.float32) / np.float32(np.sqrt(dim))

    def sample(m: int, rng: np.random.Generator) -> np.ndarray:
        out = np.empty((m, dim), dtype=np.float32)
        for start in range(0, m, 262_144):  # chunks keep float temporaries small at 1M
            stop = min(m, start + 262_144)
            c = rng.choice(n_clusters, stop - start, p=weights)
            x = centers[c] + spread[c, None] * rng.standard_normal((stop - start, dim), dtype=np.float32)
            out[start:stop] = x / np.linalg.norm(x, axis=1, keepdims=True)
        return out

    return sample(n, rng), sample


def _timed_single_queries(
    index: ItemIndex, queries: np.ndarray, k: int, label: str, progress: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Search one query per call; returns (ids (m, k), milliseconds per query)."""

    for q in queries[:5]:  # warm caches and the thread pool before timing
        index.search(q[None], k)
    ids = np.empty((len(queries), k), dtype=np.int64)
    ms = np.empty(len(queries))
    for i in progress_bar(range(len(queries)), desc=label, enabled=progress, unit="query"):
        t0 = time.perf_counter()
        _, found = index.search(queries[i : i + 1], k)
        ms[i] = (time.perf_counter() - t0) * 1e3
        ids[i] = found[0]
    return ids, ms


def bench_recall(
    n_items: int = 1_000_000,
    dim: int = 64,
    kind: str = "hnsw",
    n_queries: int = 1000,
    k: int = 100,
    seed: int = 0,
    progress: bool = True,
    n_exact_timed: int = 200,
    index_params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Benchmark index ``kind`` against exact search; returns the JSON-ready report."""
    if n_queries < 1 or k < 1:
        raise ValueError(f"need n_queries >= 1 and k >= 1, got n_queries={n_queries}, k={k}")

    def say(msg: str) -> None:
        if progress:
            print(f"[bench_recall] {msg}", file=sys.stderr, flush=True)

    say(f"drawing {n_items} x {dim} clustered item vectors")
    items, sample = clustered_vectors(n_items, dim, seed)
    queries = sample(n_queries, np.random.default_rng(seed + 1))
    exact = ItemIndex.build(items, "flat")
    say(f"building {kind} index")
    ann = ItemIndex.build(items, kind, **(index_params or {}))  # type: ignore[arg-type]
    say(f"built in {ann.build_s:.1f} s; exact top-{k} for {n_queries} queries")
    _, truth = exact.search(queries, k)
    ann_ids, ann_ms = _timed_single_queries(ann, queries, k, f"{kind} search", progress)
    _, exact_ms = _timed_single_queries(exact, queries[:n_exact_timed], k, "exact search", progress)
    p50 = float(np.percentile(exact_ms, 50)), float(np.percentile(ann_ms, 50))
    return {
        "items": n_items,
        "dim": dim,
        "index": kind,
        "build_s": round(ann.build_s, 2),
        "memory_mb": round(ann.nbytes() / 2**20, 1),
        f"recall@{k}": round(overlap_at_k(ann_ids, truth), 4),
        "exact_ms_p50": round(p50[0], 3),
        "exact_ms_p99": round(float(np.percentile(exact_ms, 99)), 3),
        "ann_ms_p50": round(p50[1], 3),
        "ann_ms_p99": round(float(np.percentile(ann_ms, 99)), 3),
        "speedup_p50": round(p50[0] / p50[1], 1),
        "params": ann.params,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--kind", choices=["flat", "ivf", "hnsw"], default="hnsw")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--param", action="append", default=[], help="index param NAME=INT, repeatable")
    ap.add_argument("--out", type=Path, help="write the JSON report here")
    args = ap.parse_args(argv)
    params = {name: int(value) for name, value in (p.split("=", 1) for p in args.param)}
    report = bench_recall(
        args.items, args.dim, args.kind, args.queries, args.k, args.seed, index_params=params
    )
    if args.out:
        write_result(args.out, report, seeds=[args.seed])
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
