"""The coarse ranking stage: scores recall candidates with the trained LambdaRank booster.

``CoarseStage`` reads the "recall" column (and the per-channel ones) through
``FeatureBuilder``, writes "coarse" and sorts by it; it never adds or drops candidates. The
pipeline cuts the ranked list to ``spec.depth`` and keeps the rest in coarse order for backfill
(``recsys.pipeline``), so the stage returns all of it. ``score_many`` scores a batch of requests with one booster call
for the offline evaluator.

Deliberately left out: training (``coarse_rank.train``) and fallbacks on error or overrun
(the pipeline applies ``spec.on_error``).
"""

from __future__ import annotations

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
        self.writes: tuple[str, ...] = (spec.name,)
        # one request scores at most a few hundred rows: extra threads only add hand-off cost
        # and oversubscribe the cores under concurrent requests (batch scoring keeps the config)
        self.num_threads = 1
        self.subdir = stage_subdir(spec.name, dict(spec.params))
        self._booster: Any = None
        self._builder: FeatureBuilder | None = None
        self._known = np.zeros(0, dtype=bool)
        self._new_items = "model"
        self._version = "unloaded"

    def load(self, artifact_dir: Any) -> None:
        """Load the booster and the fitted feature builder from ``artifact_dir/<subdir>``.

        The builder carries every item and segment table the features need, so the split is
        not read here.
        """
        import lightgbm as lgb  # lazy: heavy, only once a model is loaded

        directory = Path(artifact_dir) / self.subdir
        if not (directory / "meta.json").exists():
            raise FileNotFoundError(f"{directory / 'meta.json'}: no trained coarse ranker (run training first)")
        # before numpy's zip reader or LightGBM parses a byte (a torn model aborts the process)
        verify_directory(directory, loads=("model.txt",))
        builder = load_builder(directory)
        model_text = (directory / "model.txt").read_text()
        booster = lgb.Booster(model_str=model_text)
        names = booster.feature_name()
        if names != builder.feature_names:
            raise ValueError(
                f"{directory}: model.txt features {names[:3]}... differ from features.json {builder.feature_names[:3]}..."
            )
        self._booster, self._builder = booster, builder
        self._known = builder.known_items()  # items with an interaction in the fitted tables
        chosen = json.loads((directory / "meta.json").read_text()).get("report", {}).get("new_items", {})
        self._new_items = served_placement(self.config.new_items, chosen.get("chosen"))
        self._version = hashlib.sha256(model_text.encode()).hexdigest()[:12]

    def version(self) -> str:
        return self._version

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        """Score ``candidates`` for ``request``; all of them, sorted by "coarse" (the pipeline cuts)."""
        return self.score_many([request], [candidates])[0]

    def score_many(self, requests: Sequence[Request], candidates: Sequence[Candidates]) -> list[Candidates]:
        """``run`` for many requests with one booster call (the evaluator's batch path)."""
        if self._booster is None or self._builder is None:
            raise StageError(f"stage {self.name!r}: load(artifact_dir) was not called")
        x = self._builder.transform_many(requests, candidates)
        scores = self._booster.predict(x, num_threads=self.num_threads) if len(x) else np.zeros(0)
        known = self._known
        out, start = [], 0
        for cands in candidates:
            part = scores[start:start + len(cands)]
            start += len(cands)
            if self._new_items == "recall_place":
                unknown = unknown_mask(cands.items, known)
                if unknown.any():
                    part = recall_places(part, cands.score("recall").astype(np.float64), unknown)
            out.append(cands.with_scores(self.name, part))
        return out
