"""Test doubles shared across the test packages: one popularity candidate stage.

``PopularityStage`` is a real (if naive) ``recsys.contract.Stage``: it ranks every item outside
the request's exclusions by ``log1p(count)`` (or the count), ties by item index, and writes its score column
under its own name. The coarse-ranker tests use it as the recall stage feeding training
(``depth`` 200, with the ``recall_popularity`` channel column and flag the real recall stage
writes), the LLM tests as the coarse stage in front of the re-ranker (``per_request_k``: at most
``request.k`` rows, as a coarse stage serves), and the HTTP tests build it through the registry
(``tests.serving.toy.PopularityRecall`` loads the counts from the artifact directory).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from offline.split import Split
from recsys.contract import Candidates, Request, StageError


class PopularityStage:
    """Candidate stage: the most popular items outside ``request.excluded``, by ``log1p(counts)``."""

    reads: tuple[str, ...] = ()

    def __init__(self, counts: np.ndarray | None = None, *, name: str = "recall", depth: int | None = None,
                 per_request_k: bool = False, channel_column: bool = False, log1p: bool = True) -> None:
        """``counts`` per item (None: set later by ``load``); ``depth`` caps the rows (None: every
        item); ``per_request_k`` caps them at ``request.k`` too; ``channel_column`` adds
        ``<name>_popularity`` and the ``src_popularity`` flag; ``log1p`` False scores the raw counts
        (the HTTP tests' hand-worked answers)."""
        self.name = name
        self.writes: tuple[str, ...] = (name,)
        self.depth = depth
        self.per_request_k = per_request_k
        self.channel_column = channel_column
        self.log1p = log1p
        self.score: np.ndarray | None = None if counts is None else self._scores(counts)

    @classmethod
    def of(cls, split: Split, **options: object) -> PopularityStage:
        """Popularity over the split's training interactions (``item_popularity("valid")``)."""
        return cls(split.item_popularity("valid"), **options)  # type: ignore[arg-type]

    def _scores(self, counts: np.ndarray) -> np.ndarray:
        counts = np.asarray(counts, dtype=np.float64)
        if counts.ndim != 1:
            raise ValueError(f"counts must be one value per item, got shape {counts.shape}")
        return (np.log1p(counts) if self.log1p else counts).astype(np.float32)

    def load(self, artifact_dir: Path) -> None:  # built from counts: nothing on disk
        return None

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        if self.score is None:
            raise StageError(f"{type(self).__name__}.run before load()")
        keep = np.ones(len(self.score), dtype=bool)
        keep[request.excluded] = False
        items = np.flatnonzero(keep)
        depth = len(items) if self.depth is None else self.depth
        if self.per_request_k:
            depth = min(depth, request.k)
        items = items[np.argsort(-self.score[items], kind="stable")[:depth]]
        s = self.score[items]
        scores = {self.name: s, **({f"{self.name}_popularity": s} if self.channel_column else {})}
        flags = {"src_popularity": np.ones(len(items), dtype=bool)} if self.channel_column else {}
        return Candidates(items=items, scores=scores, flags=flags, order_by=self.name)

    def version(self) -> str:
        return "popularity"
