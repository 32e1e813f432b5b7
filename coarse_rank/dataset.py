"""Query groups for learning to rank: one group per user, candidates from any recall ``Stage``.

Two phases, both leak-free with respect to ``split.test`` (never read here):

- ``"train"``: for each of the last ``positions`` training items j (1 = last), history = the
  training sequence before it, label = that item (the next interaction, held out of the
  history); a user contributes the positions their sequence is long enough for (at least
  one item must remain as history). More positions give LambdaRank more query groups; the
  recall model producing their candidates must not have trained on those items.
- ``"valid"``: history = ``split.history(u, "valid")`` (the whole training sequence), label =
  ``split.valid[u]``.

A group's relevance is 1 for the label item and 0 for every other candidate; a group whose
candidates miss the label has no LambdaRank gradient and is marked ``has_positive=False``.

Deliberately left out: features (``coarse_rank.features``) and fitting (``coarse_rank.train``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from offline.split import Split
from recsys.contract import Candidates, Request, Stage
from recsys.names import RECALL_SCORE_PREFIX, SOURCE_FLAG_PREFIX
from recsys.progress import progress_bar

QueryPhase = Literal["train", "valid"]


@dataclass
class QueryGroups:
    """Aligned per-group lists: the request, its candidates and its label item."""

    phase: QueryPhase
    requests: list[Request]
    candidates: list[Candidates]
    labels: np.ndarray  # int64 label item per group

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def has_positive(self) -> np.ndarray:
        return np.array([bool((c.items == t).any()) for c, t in zip(self.candidates, self.labels, strict=True)])

    @property
    def sizes(self) -> np.ndarray:
        return np.array([len(c) for c in self.candidates], dtype=np.int64)

    def relevance(self) -> np.ndarray:
        """Row-stacked 0/1 labels, aligned with ``FeatureBuilder.transform_many``."""
        parts = [(c.items == t).astype(np.float32) for c, t in zip(self.candidates, self.labels, strict=True)]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def subset(self, mask: np.ndarray) -> QueryGroups:
        keep = np.flatnonzero(mask)
        return QueryGroups(self.phase, [self.requests[i] for i in keep],
                           [self.candidates[i] for i in keep], self.labels[keep])


def query_inputs(
    split: Split, phase: QueryPhase, users: Sequence[int] | np.ndarray | None = None, positions: int = 1
) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """(user indices, histories, label items) of ``phase`` for ``users`` (default: all eligible).

    A train-phase user appears once per usable position (latest label first).
    """
    seqs = split.train_sequences
    pool = np.arange(split.n_users) if users is None else np.asarray(users, dtype=np.int64)
    if phase == "train":
        if positions < 1:
            raise ValueError(f"positions must be >= 1, got {positions}")
        rows = [(int(u), j) for u in pool for j in range(1, positions + 1) if len(seqs[u]) >= j + 1]
        owners = np.array([u for u, _ in rows], dtype=np.int64)
        return owners, [seqs[u][:-j] for u, j in rows], np.array([seqs[u][-j] for u, j in rows], dtype=np.int64)
    if phase == "valid":
        return pool, [split.history(int(u), "valid") for u in pool], split.valid[pool].astype(np.int64)
    raise ValueError(f"query phase must be 'train' or 'valid', got {phase!r}")


def build_groups(
    split: Split,
    candidate_stage: Stage,
    phase: QueryPhase,
    *,
    users: Sequence[int] | np.ndarray | None = None,
    k: int = 10,
    progress: bool = True,
    positions: int = 1,
) -> QueryGroups:
    """Run ``candidate_stage`` once per query of ``phase`` and collect the query groups."""
    pool, histories, labels = query_inputs(split, phase, users, positions)
    requests, cands = [], []
    for u, hist in progress_bar(list(zip(pool, histories, strict=True)), desc=f"coarse {phase} candidates",
                                enabled=progress, unit="user"):
        req = split.request(int(u), hist, k=k, request_id=f"coarse-{phase}-{u}")
        requests.append(req)
        cands.append(candidate_stage.run(req, Candidates.empty()))
    return QueryGroups(phase, requests, cands, labels)


def channel_columns(groups: Sequence[QueryGroups]) -> tuple[list[str], list[str]]:
    """Sorted recall channel score columns (``recall_*``) and flags (``src_*``) seen in any group."""
    scores: set[str] = set()
    flags: set[str] = set()
    for g in groups:
        for c in g.candidates:
            scores.update(s for s in c.scores if s.startswith(RECALL_SCORE_PREFIX))
            flags.update(f for f in c.flags if f.startswith(SOURCE_FLAG_PREFIX))
    return sorted(scores), sorted(flags)


def training_prefix(split: Split, positions: int = 1) -> pd.DataFrame:
    """``split.train`` without the train labels: each user's last ``min(positions, n - 1)`` of ``n``
    rows, the items ``query_inputs`` makes labels (a user's first item is never one). What a model
    may see before the train labels, and what ``recall_holdout`` trains on (``jobs.train.holdout_sequences``).

    Features of the train-phase groups are fitted on this table, so a label's own interaction
    never feeds its features (otherwise ``follow_last`` would be >= 1 for every train label
    but not for valid ones, and the ranker would learn to trust a leak).
    """
    users = split.train["user_idx"].to_numpy()
    # rank of each row from the end of its user's block (0 = last): rows are sorted by user, time
    ends = np.flatnonzero(np.r_[users[1:] != users[:-1], True])
    lengths = np.diff(np.r_[-1, ends])
    block_end = np.repeat(ends, lengths)
    from_end = block_end - np.arange(len(users))
    labels = np.minimum(positions, np.repeat(lengths, lengths) - 1)  # label rows of each row's user
    return split.train.loc[from_end >= labels].reset_index(drop=True)


def prefix_popularity(split: Split, positions: int = 1) -> np.ndarray:
    """Interaction counts per item over ``training_prefix``: every training event but the train
    labels, the popularity a recall stage serving the train-phase groups may know
    (``split.item_popularity("valid")`` also counts each label's own event)."""
    items = training_prefix(split, positions)["item_idx"].to_numpy()
    return np.bincount(items, minlength=split.n_items).astype(np.float64)
