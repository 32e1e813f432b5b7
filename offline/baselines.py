"""The popularity baseline and the one evaluation entry point every model uses.

``popularity_rankings`` ranks the full catalog by interaction count over what is visible
before the phase's targets (``Split.item_popularity(phase)``: train for valid, train + valid
for test), excluding each user's input history, ties to the lower item index. Any model that
does not beat it is not worth serving.

``evaluate_rankings`` / ``evaluate_rankings_per_user`` score ``[n_users, K]`` rankings against
the split's targets under the protocol of ``offline.protocol`` (full ranking, history
excluded by the model). Recall, coarse ranking, the LLM re-ranker and the A/B reports all call
these, so every number in the project comes from one code path.

Deliberately left out: personalised baselines (item-kNN, SASRec) and sampled evaluation.
"""

from __future__ import annotations

import numpy as np

from offline.metrics import per_user_metrics, rank_full, summarize
from offline.split import Phase, Split

_CHUNK_USERS = 1024  # rows of the [users, n_items] score matrix built at once


def input_histories(split: Split, phase: Phase) -> list[np.ndarray]:
    """Per user, the items a ``phase`` ranking must exclude (its input history)."""
    return [split.history(u, phase) for u in range(split.n_users)]


def popularity_rankings(split: Split, phase: Phase, k: int = 10) -> np.ndarray:
    """Top-k most popular unseen items per user, ``[n_users, k]`` int64 (see module docstring)."""
    if phase not in ("valid", "test"):
        raise ValueError(f"popularity_rankings: phase must be 'valid' or 'test', got {phase!r}")
    pop = split.item_popularity(phase)
    histories = input_histories(split, phase)
    out = np.empty((split.n_users, k), dtype=np.int64)
    for start in range(0, split.n_users, _CHUNK_USERS):
        rows = histories[start:start + _CHUNK_USERS]
        out[start:start + len(rows)] = rank_full(np.broadcast_to(pop, (len(rows), len(pop))), rows, k)
    return out


def evaluate_rankings_per_user(split: Split, rankings: np.ndarray, phase: Phase, k: int = 10) -> dict[str, np.ndarray]:
    """Per-user NDCG@k, Recall@k, MRR@k of ``rankings`` against ``split.targets(phase)``."""
    rankings = np.asarray(rankings)
    if rankings.ndim != 2 or len(rankings) != split.n_users:
        raise ValueError(
            f"evaluate_rankings: rankings must be [n_users={split.n_users}, K], got shape {rankings.shape}"
        )
    return per_user_metrics(rankings, split.targets(phase), k)


def evaluate_rankings(split: Split, rankings: np.ndarray, phase: Phase, k: int = 10) -> dict[str, float]:
    """Mean NDCG@k, Recall@k, MRR@k over all users (keys ``"ndcg@10"`` etc.)."""
    return summarize(evaluate_rankings_per_user(split, rankings, phase, k))
