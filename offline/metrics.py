"""Ranking metrics for the leave-one-out protocol (one held-out target per user).

Accuracy (per user, so ``offline.bootstrap`` can pair two rankers user by user):
NDCG@k = 1/log2(rank+2) (``ndcg_at_ranks``; the ideal DCG of one target is 1), Recall@k (= HR@k
with one target) and MRR@k = 1/(rank+1), each 0 when the target is not in the top k (rank is
0-based); ``random_ndcg`` is NDCG@k's expectation when the target's place is uniformly random.
Beyond accuracy, for the A/B reports: catalog ``coverage``, ``intra_list_diversity`` (Ziegler
et al., 2005) and ``novelty`` as mean self-information (Zhou et al., 2010). ``rank_full`` turns
a full score matrix into top-k lists with the history excluded and ties broken by lower item
index, so every full-ranking model is cut the same way.

Rankings are ``[n_users, K]`` int64 item indices; ``-1`` pads lists shorter than K.

Deliberately left out: sampled-negative metrics (we rank the full catalog, as LlamaRec does),
graded relevance and multiple targets per user.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

PAD = -1


def per_user_metrics(rankings: np.ndarray, targets: np.ndarray, k: int = 10) -> dict[str, np.ndarray]:
    """NDCG@k, Recall@k and MRR@k per user (float64 arrays of length n_users).

    >>> r = per_user_metrics(np.array([[5, 7, 9], [1, 2, 3]]), np.array([9, 4]), k=3)
    >>> r["ndcg@3"].tolist(), r["mrr@3"].round(3).tolist()
    ([0.5, 0.0], [0.333, 0.0])
    """
    rankings, targets = _check_rankings(rankings, targets, k)
    top = rankings[:, :k]
    hits = top == targets[:, None]
    hit = hits.any(axis=1)
    rank = np.where(hit, hits.argmax(axis=1), 0)  # first occurrence of the target
    return {
        f"ndcg@{k}": ndcg_at_ranks(np.where(hit, rank, -1), k),
        f"recall@{k}": hit.astype(np.float64),
        f"mrr@{k}": np.where(hit, 1.0 / (rank + 1.0), 0.0),
    }


def ndcg_at_ranks(ranks: np.ndarray, k: int = 10) -> np.ndarray:
    """NDCG@k per user from the 0-based rank of their one target (negative: not ranked).

    One relevant item has an ideal DCG of 1, so NDCG@k = 1/log2(rank+2) when rank < k, else 0.

    >>> ndcg_at_ranks(np.array([0, 2, 10, -1]), k=10).tolist()
    [1.0, 0.5, 0.0, 0.0]
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    ranks = np.asarray(ranks, dtype=np.int64)
    found = (ranks >= 0) & (ranks < k)
    return np.where(found, 1.0 / np.log2(np.where(found, ranks, 0) + 2.0), 0.0)


def random_ndcg(n_candidates: np.ndarray, k: int = 10) -> np.ndarray:
    """Expected NDCG@k of one target placed uniformly at random among ``n_candidates`` (0 for none).

    The mean of ``ndcg_at_ranks(r, k)`` over r = 0 .. n-1: sum_{r < min(k, n)} 1/log2(r+2) / n.

    >>> random_ndcg(np.array([1, 2, 0]), k=10).round(4).tolist()
    [1.0, 0.8155, 0.0]
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    n = np.asarray(n_candidates, dtype=np.int64)
    if (n < 0).any():
        raise ValueError(f"n_candidates must be >= 0, got {n[n < 0][:5]}")
    dcg = np.concatenate([[0.0], np.cumsum(1.0 / np.log2(np.arange(k) + 2.0))])  # dcg[m]: ranks 0 .. m-1
    return np.where(n > 0, dcg[np.minimum(n, k)] / np.maximum(n, 1), 0.0)


def summarize(per_user: dict[str, np.ndarray]) -> dict[str, float]:
    """Mean of each per-user metric array."""
    out = {}
    for name, values in per_user.items():
        if len(values) == 0:
            raise ValueError(f"summarize: metric {name!r} has no users")
        out[name] = float(np.mean(values))
    return out


def candidates_found(candidates: Sequence[np.ndarray] | np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per user, 1.0 when the target is among their candidates, else 0.0.

    >>> candidates_found([np.array([1, 2]), np.array([3])], np.array([2, 4])).tolist()
    [1.0, 0.0]
    """
    targets = np.asarray(targets, dtype=np.int64)
    if len(candidates) != len(targets):
        raise ValueError(f"candidate_recall: {len(candidates)} candidate lists for {len(targets)} targets")
    if isinstance(candidates, np.ndarray) and candidates.ndim == 2:
        return (candidates == targets[:, None]).any(axis=1).astype(np.float64)
    return np.array([bool(np.any(np.asarray(c) == t)) for c, t in zip(candidates, targets, strict=True)],
                    dtype=np.float64)


def candidate_recall(candidates: Sequence[np.ndarray] | np.ndarray, targets: np.ndarray) -> float:
    """Share of users whose target is among their candidates (a recall channel's ceiling)."""
    if len(targets) == 0:
        raise ValueError("candidate_recall: no users")
    return float(candidates_found(candidates, targets).mean())


def coverage(rankings: np.ndarray, n_items: int, k: int = 10) -> float:
    """Distinct items appearing in any top-k list, as a share of the catalog."""
    if n_items < 1:
        raise ValueError(f"coverage: n_items must be >= 1, got {n_items}")
    top = np.asarray(rankings)[:, :k]
    return len(np.unique(top[top != PAD])) / n_items


def novelty(rankings: np.ndarray, item_popularity: np.ndarray, k: int = 10, smoothing: float = 1.0) -> float:
    """Mean self-information -log2(p(i)) of recommended items, averaged per user then over users.

    p(i) = (count_i + smoothing) / (sum(count) + smoothing * n_items); the default Laplace
    smoothing keeps never-seen items finite (with ``smoothing=0`` they score ``inf``).
    Users whose list is all padding are skipped.
    """
    pop = np.asarray(item_popularity, dtype=np.float64)
    if smoothing < 0:
        raise ValueError(f"novelty: smoothing must be >= 0, got {smoothing}")
    total = pop.sum() + smoothing * len(pop)
    if total <= 0:
        raise ValueError("novelty: item_popularity sums to 0 (pass smoothing > 0)")
    share = (pop + smoothing) / total
    with np.errstate(divide="ignore"):
        info = -np.log2(share)
    top = np.asarray(rankings)[:, :k]
    valid = top != PAD
    per_item = np.where(valid, info[np.where(valid, top, 0)], 0.0)
    n_valid = valid.sum(axis=1)
    if not n_valid.any():
        raise ValueError("novelty: every ranking is empty")
    has = n_valid > 0
    return float(np.mean(per_item[has].sum(axis=1) / n_valid[has]))


def intra_list_diversity(
    rankings: np.ndarray, item_features: np.ndarray | Sequence[Sequence[str]], k: int = 10
) -> float:
    """Mean pairwise distance within each top-k list, averaged over users with >= 2 items.

    ``item_features`` is either a float matrix ``[n_items, d]`` (distance = 1 - cosine) or
    one list of categories per item (distance = 1 - Jaccard; two empty sets count as equal).
    """
    if isinstance(item_features, np.ndarray) and item_features.ndim == 2 and item_features.dtype != object:
        vecs = item_features.astype(np.float64)
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        vecs = vecs / np.where(norms == 0, 1.0, norms)
        multi_hot = False
    else:
        vecs = _multi_hot(cast(Sequence[Sequence[str]], item_features))
        multi_hot = True
    top = np.asarray(rankings)[:, :k]
    dist, n_pairs = np.zeros(len(top)), np.zeros(len(top), dtype=np.int64)
    for start in range(0, len(top), _CHUNK_USERS):  # bounds the [n, k, d] gather
        rows = slice(start, start + _CHUNK_USERS)
        dist[rows], n_pairs[rows] = _pairwise_distance(top[rows], vecs, multi_hot)
    if not n_pairs.any():
        raise ValueError("intra_list_diversity: no list holds two items")
    has = n_pairs > 0
    return float(np.mean(dist[has] / n_pairs[has]))


_CHUNK_USERS = 4096


def _pairwise_distance(top: np.ndarray, vecs: np.ndarray, multi_hot: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per list: summed distance over item pairs i < j (padding skipped) and the pair count."""
    valid = top != PAD
    x = vecs[np.where(valid, top, 0)]  # [n, k, d]
    inter = np.einsum("nid,njd->nij", x, x)
    if multi_hot:  # Jaccard similarity |A & B| / |A | B|
        size = x.sum(axis=2)
        union = size[:, :, None] + size[:, None, :] - inter
        sim = np.where(union > 0, inter / np.where(union > 0, union, 1.0), 1.0)
    else:  # rows are unit-normalised: the dot product is the cosine
        sim = inter
    upper = np.triu(np.ones((top.shape[1], top.shape[1]), dtype=bool), 1)
    pair = valid[:, :, None] & valid[:, None, :] & upper
    return np.where(pair, 1.0 - sim, 0.0).sum(axis=(1, 2)), pair.sum(axis=(1, 2))


def _multi_hot(categories: Sequence[Sequence[str]]) -> np.ndarray:
    names = sorted({c for cats in categories for c in cats})
    col = {c: j for j, c in enumerate(names)}
    out = np.zeros((len(categories), max(len(names), 1)), dtype=np.float64)
    for i, cats in enumerate(categories):
        for c in cats:
            out[i, col[c]] = 1.0
    return out


def rank_full(scores: np.ndarray, exclude: Sequence[np.ndarray], k: int = 10) -> np.ndarray:
    """Top-k item indices per row of a full score matrix ``[n, n_items]``.

    Items in ``exclude[row]`` (the user's input history) get -inf and never appear; rows with
    fewer than k rankable items (score > -inf) are padded with -1. Ties go to the lower item
    index, so results do not depend on argpartition's internals. Scores must not be NaN.
    """
    s = np.array(scores, dtype=np.float64)  # a copy: excluded items are overwritten
    if s.ndim != 2:
        raise ValueError(f"rank_full: scores must be [n, n_items], got shape {s.shape}")
    if len(exclude) != len(s):
        raise ValueError(f"rank_full: {len(exclude)} exclude lists for {len(s)} score rows")
    if k < 1:
        raise ValueError(f"rank_full: k must be >= 1, got {k}")
    if np.isnan(s).any():
        raise ValueError(f"rank_full: NaN scores in row(s) {np.flatnonzero(np.isnan(s).any(axis=1))[:5]}")
    n, n_items = s.shape
    for row, ex in enumerate(exclude):
        s[row, np.asarray(ex, dtype=np.int64)] = -np.inf
    kk = min(k, n_items)
    top = np.argpartition(-s, kk - 1, axis=1)[:, :kk] if kk < n_items else np.tile(np.arange(n_items), (n, 1))
    kth = np.take_along_axis(s, top, axis=1).min(axis=1)
    tied = (s >= kth[:, None]).sum(axis=1) > kk  # the cut falls inside a tie: resolve by index
    if tied.any():
        idx = np.broadcast_to(np.arange(n_items), (int(tied.sum()), n_items))
        top[tied] = np.lexsort((idx, -s[tied]), axis=-1)[:, :kk]
    top_scores = np.take_along_axis(s, top, axis=1)
    order = np.lexsort((top, -top_scores), axis=-1)
    top = np.take_along_axis(top, order, axis=1)
    top[np.take_along_axis(top_scores, order, axis=1) == -np.inf] = PAD
    out = np.full((n, k), PAD, dtype=np.int64)
    out[:, :kk] = top
    return out


def _check_rankings(rankings: np.ndarray, targets: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    rankings = np.asarray(rankings, dtype=np.int64)
    targets = np.asarray(targets, dtype=np.int64)
    if rankings.ndim != 2:
        raise ValueError(f"rankings must be [n_users, K], got shape {rankings.shape}")
    if targets.shape != (len(rankings),):
        raise ValueError(f"targets must be [{len(rankings)}], got shape {targets.shape}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if (targets < 0).any():
        raise ValueError(f"targets must be item indices >= 0, got {targets[targets < 0][:5]}")
    return rankings, targets
