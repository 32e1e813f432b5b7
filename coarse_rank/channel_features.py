"""Coarse features from the recall channels' models (``CoarseConfig.channel_features``).

The recall stage hands the coarse ranker each channel's raw score, but only for the items
that channel itself returned (NaN elsewhere). These features score *every* candidate:

- ``covisit_recent``: the co-visitation score (``offline.item_neighbours.covisitation``, window
  ``channel_window``) of the item to the user's last ``channel_last_n`` items, recency-decayed
  exactly as the co-visitation channel queries it; ``covisit_recent_rel`` divides it by the
  request's best (LambdaRank compares items within a request, so the relative value travels
  better across users with short and long histories);
- ``item_model_score`` / ``item_model_rel``: the same for the item model (EASE up to
  ``EASE_MAX_ITEMS`` items, item-kNN beyond) from the last ``item_model_last_n`` items;
- ``rank_<channel>``: the item's rank (0 = best) among the request's candidates by each
  recall channel's raw score (``recall_<channel>``), NaN where that channel did not return it.

The matrices are fitted by ``FeatureBuilder.fit`` on the builder's own interactions, so the
train-phase builder (fitted on ``training_prefix``) never sees a label's interaction.

Deliberately left out: tuning these models' hyper-parameters here (they follow the recall
channels' measured defaults, ``recall.config.RecallConfig``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import sparse

from coarse_rank.config import CoarseConfig
from offline.item_neighbours import NeighbourChannel, covisitation, item_model
from recsys.contract import Candidates
from recsys.names import RECALL_SCORE_PREFIX

CHANNEL_FEATURES: dict[str, str] = {
    "covisit_recent": "co-visitation score to the last channel_last_n history items (recency-decayed)",
    "covisit_recent_rel": "covisit_recent / the request's best covisit_recent (NaN when every one is 0)",
    "item_model_score": "item-model (EASE; item-kNN above EASE_MAX_ITEMS) score from the last item_model_last_n items",
    "item_model_rel": "item_model_score / the request's best item_model_score (NaN when none is positive)",
}
EASE_L2, EASE_MAX_ITEMS, KNN_SHRINK, NEIGHBOURS, BACKWARD = 500.0, 10_000, 10.0, 200, 0.5
PREFIX = "chan_"  # array names in features.npz


def rank_names(score_columns: Sequence[str]) -> list[str]:
    """``rank_<channel>`` for each ``recall_<channel>`` score column."""
    return [f"rank_{c.removeprefix(RECALL_SCORE_PREFIX)}" for c in score_columns]


def sequences(users: np.ndarray, items: np.ndarray) -> list[np.ndarray]:
    """Per-user item sequences of an interaction table sorted by user, then time.

    >>> [s.tolist() for s in sequences(np.array([0, 0, 2]), np.array([5, 6, 7]))]
    [[5, 6], [7]]
    """
    cuts = np.flatnonzero(np.diff(users)) + 1
    return [np.asarray(s, dtype=np.int64) for s in np.split(items, cuts)] if len(items) else []


def rank_among(scores: np.ndarray) -> np.ndarray:
    """0-based rank by descending score (ties to the earlier row), NaN where the score is NaN.

    >>> rank_among(np.array([0.2, np.nan, 0.9, 0.2], np.float32)).tolist()
    [1.0, nan, 0.0, 2.0]
    """
    known = ~np.isnan(scores)
    rank = np.full(len(scores), np.nan, np.float32)
    idx = np.flatnonzero(known)
    rank[idx[np.argsort(-scores[idx], kind="stable")]] = np.arange(len(idx), dtype=np.float32)
    return rank


class ChannelTables:
    """The two fitted channel models of the features above; saved inside ``features.npz``."""

    def __init__(self, covisit: NeighbourChannel, item_sim: NeighbourChannel) -> None:
        self.covisit, self.item_sim = covisit, item_sim

    @classmethod
    def fit(cls, users: np.ndarray, items: np.ndarray, n_items: int, config: CoarseConfig) -> ChannelTables:
        seqs = sequences(users, items)
        cov = covisitation(seqs, n_items, window=config.channel_window, backward=BACKWARD, top_k=NEIGHBOURS)
        _, sim = item_model(seqs, n_items, kind="ease", top_k=NEIGHBOURS, l2=EASE_L2, shrink=KNN_SHRINK,
                            max_dense=EASE_MAX_ITEMS)
        return cls(NeighbourChannel("covisit", cov, config.channel_last_n),
                   NeighbourChannel("item_model", sim, config.item_model_last_n))

    def columns(self, hist: np.ndarray, candidates: Candidates, score_columns: Sequence[str]) -> list[np.ndarray]:
        """The ``CHANNEL_FEATURES`` columns then one ``rank_<channel>`` column per score column."""
        items = candidates.items
        out: list[np.ndarray] = []
        for channel in (self.covisit, self.item_sim):
            s = channel.scores(hist)[items] if len(hist) else np.full(len(items), np.nan, np.float32)
            best = float(np.nanmax(s)) if len(s) and np.isfinite(s).any() else 0.0
            out += [s, s / best if best > 0 else np.full(len(items), np.nan, np.float32)]
        return out + [rank_among(candidates.score(c)) for c in score_columns]

    def arrays(self) -> dict[str, np.ndarray]:
        out = {}
        for key, channel in (("covisit", self.covisit), ("item_sim", self.item_sim)):
            w = channel.weights
            out.update({f"{PREFIX}{key}_data": w.data, f"{PREFIX}{key}_indices": w.indices,
                        f"{PREFIX}{key}_indptr": w.indptr})
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], n_items: int, config: CoarseConfig) -> ChannelTables:
        def csr(key: str) -> sparse.csr_matrix:
            parts = (arrays[f"{PREFIX}{key}_data"], arrays[f"{PREFIX}{key}_indices"], arrays[f"{PREFIX}{key}_indptr"])
            return sparse.csr_matrix(parts, shape=(n_items, n_items))

        return cls(NeighbourChannel("covisit", csr("covisit"), config.channel_last_n),
                   NeighbourChannel("item_model", csr("item_sim"), config.item_model_last_n))
