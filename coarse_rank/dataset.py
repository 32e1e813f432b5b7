"""Query groups for learning to rank: one group per user, candidates from any recall ``Stage``.

Two phases, both leak-free with respect to ``split.test`` (never read here):

- ``"train"``: history = the user's training sequence minus its last item, label = that last
  item (the next interaction, held out of the history); users with < 2 training items have
  no such example.
- ``"valid"``: history = ``split.history(u, "valid")`` (the whole training sequence), label =
  ``split.valid[u]``.

A group's relevance is 1 for the label item and 0 for every other candidate; a group whose
candidates miss the label has no LambdaRank gradient and is marked ``has_positive=False``.

Deliberately left out: features (``coarse_rank.features``) and fitting (``coarse_rank.train``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from offline.split import Split
from recsys.contract import Candidates, Request, Stage

QueryPhase = Literal["train", "valid"]
USER_ATTRIBUTES = ("age", "gender", "occupation", "risk_tolerance")


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


def user_attributes(split: Split, user_idx: int) -> dict[str, Any]:
    """The user's attributes from ``split.users`` as a request carries them (missing ones absent)."""
    row = split.users.iloc[user_idx]
    return {k: row[k] for k in USER_ATTRIBUTES if k in row.index and not pd.isna(row[k])}


def query_inputs(split: Split, phase: QueryPhase, users: Sequence[int] | np.ndarray | None = None) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """(user indices, histories, label items) of ``phase`` for ``users`` (default: all eligible)."""
    seqs = split.train_sequences
    pool = np.arange(split.n_users) if users is None else np.asarray(users, dtype=np.int64)
    if phase == "train":
        pool = pool[[len(seqs[u]) >= 2 for u in pool]] if len(pool) else pool
        return pool, [seqs[u][:-1] for u in pool], np.array([seqs[u][-1] for u in pool], dtype=np.int64)
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
) -> QueryGroups:
    """Run ``candidate_stage`` once per user of ``phase`` and collect the query groups."""
    pool, histories, labels = query_inputs(split, phase, users)
    requests, cands = [], []
    for u, hist in tqdm(list(zip(pool, histories, strict=True)), desc=f"coarse {phase} candidates",
                        disable=not progress, unit="user"):
        req = Request(user_id=str(split.vocab.user_ids[u]), k=k, user_idx=int(u), history=hist,
                      user_attrs=user_attributes(split, int(u)), request_id=f"coarse-{phase}-{u}")
        requests.append(req)
        cands.append(candidate_stage.run(req, Candidates.empty()))
    return QueryGroups(phase, requests, cands, labels)


def channel_columns(groups: Sequence[QueryGroups]) -> tuple[list[str], list[str]]:
    """Sorted recall channel score columns (``recall_*``) and flags (``src_*``) seen in any group."""
    scores: set[str] = set()
    flags: set[str] = set()
    for g in groups:
        for c in g.candidates:
            scores.update(s for s in c.scores if s.startswith("recall_"))
            flags.update(f for f in c.flags if f.startswith("src_"))
    return sorted(scores), sorted(flags)


def training_prefix(split: Split) -> pd.DataFrame:
    """``split.train`` without each user's last row: what a model may see before the train labels.

    Features of the train-phase groups are fitted on this table, so a label's own interaction
    never feeds its features (otherwise ``follow_last`` would be >= 1 for every train label
    but not for valid ones, and the ranker would learn to trust a leak).
    """
    users = split.train["user_idx"].to_numpy()
    last = np.ones(len(users), dtype=bool)
    last[:-1] = users[1:] != users[:-1]
    return split.train.loc[~last].reset_index(drop=True)
