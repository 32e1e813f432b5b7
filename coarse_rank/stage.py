"""The coarse ranking stage: scores recall candidates with the trained LambdaRank boosters.

``CoarseStage`` reads the "recall" column (and the per-channel ones) through
``FeatureBuilder``, writes "coarse" (the mean of the ensemble's fits, ``coarse.ensemble``) and
sorts by it; it never adds or drops candidates. It also writes "item_model", the item model's
score among the ranker's features (``recsys.names.ITEM_MODEL``; NaN for an item without
interactions), so the fusion gate can weigh that strong simple order against the ranker's where a
blend wins on valid (on short histories EASE alone comes close to the ranker). The pipeline cuts
the ranked list to ``spec.depth`` and keeps the rest in coarse order for backfill
(``recsys.pipeline``), so the stage returns all of it. ``score_many`` scores a batch of requests
with one call per booster for the offline evaluator.

Deliberately left out: training (``coarse_rank.train``) and fallbacks on error or overrun
(the pipeline applies ``spec.on_error``).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from coarse_rank.config import CoarseConfig, served_placement, stage_subdir
from coarse_rank.feature_store import load_builder
from coarse_rank.features import FeatureBuilder
from coarse_rank.new_items import recall_places, unknown_mask
from recsys.config import StageSpec
from recsys.contract import ArtifactSubdir, Candidates, Request, StageError
from recsys.manifest import verify_directory
from recsys.names import ITEM_MODEL

ITEM_MODEL_FEATURE = "item_model_score"  # the feature written again as the ITEM_MODEL column


class CoarseStage(ArtifactSubdir):
    """Built cheaply as ``CoarseStage(spec, settings.coarse)``; ``load`` reads ``<artifact_dir>/<subdir>``.

    The ``CoarseConfig`` is that of training; serving reads everything it needs from the saved
    model (the booster and the fitted feature builder), so the stage only keeps it as ``config``.

    ``spec.params``: ``subdir`` (default ``"coarse"``) selects another trained copy beside the
    default one, e.g. ``coarse_tags`` (the tag-feature model of ``jobs.coarse_tags``).
    """

    reads: tuple[str, ...] = ("recall",)

    def __init__(self, spec: StageSpec, config: CoarseConfig) -> None:
        self.spec = spec
        self.config = config
        self.name = spec.name
        self.writes: tuple[str, ...] = (spec.name, ITEM_MODEL)  # ITEM_MODEL only with channel features
        # one request scores at most a few hundred rows: extra threads only add hand-off cost
        # and oversubscribe the cores under concurrent requests (batch scoring keeps the config)
        self.num_threads = 1
        self.subdir = stage_subdir(spec.name, dict(spec.params))
        self._boosters: list[Any] = []  # the ensemble's fits; the served score is the mean of theirs
        self._builder: FeatureBuilder | None = None
        self._known = np.zeros(0, dtype=bool)
        self._item_model_at: int | None = None  # ITEM_MODEL_FEATURE's column in the feature matrix
        self._new_items = "model"
        self._version = "unloaded"

    def load(self, artifact_dir: Any) -> None:
        """Load the boosters (one per ensemble fit) and the fitted feature builder from ``artifact_dir/<subdir>``.

        The builder carries every item and segment table the features need, so the split is
        not read here.
        """
        import lightgbm as lgb  # lazy: heavy, only once a model is loaded

        directory = Path(artifact_dir) / self.subdir
        if not (directory / "meta.json").exists():
            raise FileNotFoundError(f"{directory / 'meta.json'}: no trained coarse ranker (run training first)")
        # every file the manifest lists (each ensemble member's too), before numpy's zip reader or
        # LightGBM parses a byte (a torn model aborts the process)
        verify_directory(directory, loads=("meta.json", "model.txt"))
        report = json.loads((directory / "meta.json").read_text()).get("report", {})
        files = tuple(report.get("ensemble", {}).get("files", ["model.txt"]))  # one fit before ensembles
        builder = load_builder(directory)
        texts = [(directory / name).read_text() for name in files]
        boosters = [lgb.Booster(model_str=text) for text in texts]
        for name, booster in zip(files, boosters, strict=True):
            if (names := booster.feature_name()) != builder.feature_names:
                raise ValueError(f"{directory}: {name} features {names[:3]}... differ from features.json "
                                 f"{builder.feature_names[:3]}...")
        self._boosters, self._builder = boosters, builder
        names = builder.feature_names  # every fit's, checked above
        self._item_model_at = names.index(ITEM_MODEL_FEATURE) if ITEM_MODEL_FEATURE in names else None
        self._known = builder.known_items()  # items with an interaction in the fitted tables
        self._new_items = served_placement(self.config.new_items, report.get("new_items", {}).get("chosen"))
        self._version = hashlib.sha256("".join(texts).encode()).hexdigest()[:12]

    def version(self) -> str:
        return self._version

    @property
    def fits(self) -> int:
        """How many fits the served score averages (``coarse.ensemble`` at training; 0 before ``load``)."""
        return len(self._boosters)

    def with_fits(self, n: int) -> CoarseStage:
        """A copy that serves the mean of the first ``n`` fits only (what fewer fits would cost and rank:
        ``bench.coarse_ensemble``); the loaded boosters are shared, not copied."""
        if not 1 <= n <= self.fits:
            raise ValueError(f"with_fits: {n} of {self.fits} loaded fits")
        out = copy.copy(self)
        out._boosters = self._boosters[:n]
        return out

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        """Score ``candidates`` for ``request``; all of them, sorted by "coarse" (the pipeline cuts)."""
        return self.score_many([request], [candidates])[0]

    def score_many(self, requests: Sequence[Request], candidates: Sequence[Candidates]) -> list[Candidates]:
        """``run`` for many requests with one booster call (the evaluator's batch path)."""
        if not self._boosters or self._builder is None:
            raise StageError(f"stage {self.name!r}: load(artifact_dir) was not called")
        x = self._builder.transform_many(requests, candidates)
        scores = (np.mean([b.predict(x, num_threads=self.num_threads) for b in self._boosters], axis=0) if len(x)
                  else np.zeros(0))
        known, at = self._known, self._item_model_at
        out, start = [], 0
        for cands in candidates:
            rows = slice(start, start + len(cands))
            part = scores[rows]
            start += len(cands)
            if self._new_items == "recall_place":
                unknown = unknown_mask(cands.items, known)
                if unknown.any():
                    part = recall_places(part, cands.score("recall").astype(np.float64), unknown)
            if at is not None:
                cands = cands.with_scores(ITEM_MODEL, x[rows, at], reorder=False)
            out.append(cands.with_scores(self.name, part))
        return out
