"""Item and segment statistics the coarse ranker's features look up, fitted on interactions.

Pure, vectorised functions over one interactions table (``user_idx, item_idx, rating,
timestamp`` sorted by user then time, the layout of ``Split.train``). Each returns an array
indexed by ``item_idx`` (or a sparse item x item matrix), so a request's features are plain
fancy-indexing lookups.

Deliberately left out: which interactions to fit on (``coarse_rank.train`` fits once on the
training prefix and once on the full training sequences to keep labels out of the features)
and how lookups become a feature matrix (``coarse_rank.features``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import sparse

# MovieLens-1M age brackets (under 18, 18-24, 25-34, 35-44, 45-49, 50-55, 56+).
AGE_BUCKET_EDGES = np.array([18, 25, 35, 45, 50, 56])
N_AGE_BUCKETS = len(AGE_BUCKET_EDGES) + 1


def log_popularity(item_idx: np.ndarray, n_items: int) -> np.ndarray:
    """log(1 + interaction count) per item.

    >>> np.expm1(log_popularity(np.array([0, 0, 2]), 3)).round().tolist()
    [2.0, 0.0, 1.0]
    """
    return np.log1p(np.bincount(item_idx, minlength=n_items)).astype(np.float32)


def recency_popularity(item_idx: np.ndarray, timestamp: np.ndarray, n_items: int, half_life_s: float) -> np.ndarray:
    """log(1 + sum of exp-decayed interactions), decay relative to the latest timestamp.

    An interaction ``half_life_s`` seconds before the newest one counts 0.5, so trending items
    rise above items that were popular long ago (the "time-decayed popularity" baseline).
    """
    if half_life_s <= 0:
        raise ValueError(f"recency_popularity: half_life_s must be > 0, got {half_life_s}")
    if len(timestamp) == 0:
        return np.zeros(n_items, dtype=np.float32)
    age = (timestamp.max() - timestamp).astype(np.float64)
    weight = np.exp2(-age / half_life_s)
    return np.log1p(np.bincount(item_idx, weights=weight, minlength=n_items)).astype(np.float32)


def shrunk_mean_rating(item_idx: np.ndarray, rating: np.ndarray, n_items: int, prior: float) -> np.ndarray:
    """Per-item mean rating shrunk toward the global mean by ``prior`` pseudo-ratings.

    NaN ratings (implicit events) are ignored; an all-implicit table gives all-NaN (LightGBM
    treats the feature as missing). Items without ratings get the global mean.
    """
    rated = ~np.isnan(rating)
    if not rated.any():
        return np.full(n_items, np.nan, dtype=np.float32)
    glob = float(rating[rated].mean())
    total = np.bincount(item_idx[rated], weights=rating[rated].astype(np.float64), minlength=n_items)
    count = np.bincount(item_idx[rated], minlength=n_items)
    denom = count + prior
    mean = np.where(denom > 0, (total + prior * glob) / np.maximum(denom, 1e-12), glob)
    return mean.astype(np.float32)


def followed_by(user_idx: np.ndarray, item_idx: np.ndarray, n_items: int, window: int) -> sparse.csr_matrix:
    """C[a, b] = how often b came 1..``window`` steps after a in the same user's sequence.

    Rows must be sorted by user, then time. The sequential counterpart of item-item
    co-occurrence (as in session-based kNN, Ludewig & Jannach 2018): it captures "what people
    watch next", which a user-level two-tower model blurs.

    >>> followed_by(np.array([0, 0, 0, 1]), np.array([2, 0, 1, 2]), 3, window=1).toarray().tolist()
    [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    """
    if window < 1:
        raise ValueError(f"followed_by: window must be >= 1, got {window}")
    rows, cols = [], []
    for d in range(1, window + 1):  # loop over offsets only; each offset is one vectorised pass
        same = user_idx[d:] == user_idx[:-d]
        rows.append(item_idx[:-d][same])
        cols.append(item_idx[d:][same])
    r = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    c = np.concatenate(cols) if cols else np.zeros(0, dtype=np.int64)
    data = np.ones(len(r), dtype=np.float32)
    mat = sparse.coo_matrix((data, (r, c)), shape=(n_items, n_items)).tocsr()
    mat.sum_duplicates()
    return mat


def segment_lift(segment: np.ndarray, item_idx: np.ndarray, n_segments: int, n_items: int, prior: float) -> np.ndarray:
    """[n_segments, n_items] ratio of an item's share inside a user segment to its overall share.

    ``segment`` gives each interaction's segment code (-1: unknown, ignored). Shares are
    shrunk toward the overall share with ``prior`` pseudo-interactions, so a rare segment
    reads ~1.0 (no evidence) instead of noise. Items never seen and empty segments read 1.0.
    """
    overall = np.bincount(item_idx, minlength=n_items).astype(np.float64)
    p = overall / max(overall.sum(), 1.0)
    known = segment >= 0
    flat = segment[known].astype(np.int64) * n_items + item_idx[known]
    counts = np.bincount(flat, minlength=n_segments * n_items).reshape(n_segments, n_items).astype(np.float64)
    total = counts.sum(axis=1, keepdims=True) + prior
    share = np.where(total > 0, (counts + prior * p[None, :]) / np.maximum(total, 1e-12), p[None, :])
    with np.errstate(divide="ignore", invalid="ignore"):
        lift = np.where(p[None, :] > 0, share / p[None, :], 1.0)
    return lift.astype(np.float32)


def age_bucket(age: np.ndarray) -> np.ndarray:
    """Age bracket code 0..6 (MovieLens-1M brackets), -1 where the age is unknown (NaN).

    >>> age_bucket(np.array([7.0, 18.0, 30.0, np.nan, 60.0])).tolist()
    [0, 1, 2, -1, 6]
    """
    age = np.asarray(age, dtype=np.float64)
    code = np.searchsorted(AGE_BUCKET_EDGES, age, side="right")
    return np.where(np.isnan(age), -1, code).astype(np.int64)


def category_matrix(categories: pd.Series) -> tuple[list[str], np.ndarray]:
    """(sorted category names, [n_items, n_categories] float32 0/1 membership matrix)."""
    lists = [list(c) if c is not None else [] for c in categories]
    names = sorted({str(c) for cats in lists for c in cats})
    col = {c: j for j, c in enumerate(names)}
    mat = np.zeros((len(lists), len(names)), dtype=np.float32)
    rows = [i for i, cats in enumerate(lists) for _ in cats]
    cols = [col[str(c)] for cats in lists for c in cats]
    mat[rows, cols] = 1.0
    return names, mat


def codes(values: pd.Series, vocabulary: list[str] | None = None) -> tuple[list[str], np.ndarray]:
    """(vocabulary, int64 code per value; -1 for missing or out-of-vocabulary values)."""
    present = [str(v) for v in values if v is not None and not pd.isna(v)]
    vocab = vocabulary if vocabulary is not None else sorted(set(present))
    index = {v: i for i, v in enumerate(vocab)}
    out = np.array(
        [index.get(str(v), -1) if v is not None and not pd.isna(v) else -1 for v in values], dtype=np.int64
    )
    return vocab, out
