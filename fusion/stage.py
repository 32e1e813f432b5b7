"""Score fusion: the final score is a weighted mean of rank-normalised score columns.

The columns are the scored stages' own (``FUSED_STAGES``) and the item model's, which the coarse
stage writes beside its score (``FUSED_COLUMNS``). Raw scores live on unrelated scales (a dot
product, a LightGBM margin, an LLM log-prob), so each is first turned into a normalised rank
within the request's candidates:

- ``linear`` (default): ``1 - r / (n - 1)`` for rank ``r`` (0 = best) among ``n`` candidates,
  so the best item gets 1 and the last 0, whatever the score scale;
- ``rrf``: reciprocal-rank style ``(c + 1) / (c + r + 1)`` (Cormack et al., 2009, with
  ``c = rrf_k``), rescaled so the best item gets 1; it rewards the head of each list more.

Tied scores share their average rank. Items a stage did not score (NaN) get that stage's
lowest value (the one for rank ``n - 1``). ``final = sum_s w_s * norm_s / sum_s w_s`` over
the stages present for this request: a stage whose column is missing or all-NaN (disabled,
failed, fell back) is left out and the remaining weights renormalise, so losing a stage
shifts the ranking smoothly instead of falling off a cliff. With no weighted stage at all the
current order is kept.

Weights come from ``artifact_dir/fusion/<key>/weights.json`` written by ``save_weights`` after
the gate (``fusion.train.gate_weights``: a grid search maximising NDCG@10 on the valid split,
served only when choosing from the grid beats coarse's order on users who took no part in the
choice, over folds of the valid users pooled, with a CI above zero), where ``<key>`` is
``weights_key_for`` (computed from the settings by ``cascade.registry.weights_key``): the scored
stages plus a digest of the columns, depths and rule sets they were tuned under. Without weights tuned for this exact pipeline, ``FusionConfig.weights`` when set, else the most refined scored stage's order
alone (no signal, no mixture).

Deliberately left out: tuning the weights (``fusion.train``) and learning-to-rank fusion.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from recsys.atomic import atomic_write_text
from recsys.config import POLICY_KINDS, StageSpec
from recsys.contract import Candidates, Request
from recsys.digest import file_sha256
from recsys.manifest import verify_directory
from recsys.names import ITEM_MODEL

FUSED_STAGES = ("recall", "coarse", "llm")  # the scored stages, least refined first
# every score column fusion may weigh, in pipeline order: the stages' own and the item model's,
# which the coarse stage writes beside its own (a strong simple order the gate may blend in)
FUSED_COLUMNS = ("recall", "coarse", ITEM_MODEL, "llm")
FINAL = "final"
WEIGHTS_FILE = "weights.json"
Normalisation = Literal["linear", "rrf"]


class FusionConfig(BaseModel):
    """Fusion weights and rank normalisation; ``weights.json`` from tuning overrides ``weights``."""

    model_config = ConfigDict(extra="forbid")

    weights: dict[str, float] | None = Field(
        default=None,
        description="Weight per score column; only relative sizes matter. None (the default, and what serves "
        "until weights are tuned for this exact pipeline): the most refined scored stage's order alone.",
    )
    normalisation: Normalisation = Field(default="linear", description="Rank normalisation: linear or rrf.")
    rrf_k: float = Field(default=60.0, gt=0, description="The c of reciprocal-rank normalisation (rrf only).")
    tune_step: float = Field(default=0.1, gt=0, le=0.5, description="Grid step on the weight simplex for tuning.")
    tune_users: int | None = Field(
        default=10_000, ge=1, description="Valid users the weights are tuned on: a seeded sample above this many "
        "(tuning runs the cascade once per user); None: every eligible user.")
    tuned: Literal["checked", "grid_best"] = Field(
        default="checked", description="Which tuned weights to serve from weights.json: 'checked' = coarse's order "
        "unless the valid grid's best mixture or another stage alone beats it with a paired-bootstrap CI above "
        "zero; 'grid_best' = the grid's best mixture regardless (still chosen on valid, never on test).")

    @field_validator("weights")
    @classmethod
    def _valid_weights(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:
            return value
        for name, w in value.items():
            if not np.isfinite(w) or w < 0:
                raise ValueError(f"weight of {name!r} must be a finite number >= 0, got {w}")
        if not any(w > 0 for w in value.values()):
            raise ValueError(f"at least one weight must be > 0, got {value}")
        return value


def rank_normalise(scores: np.ndarray, method: Normalisation = "linear", rrf_k: float = 60.0) -> np.ndarray:
    """Scores -> normalised ranks in [0, 1] (best 1); ties share the average rank; NaN lowest.

    >>> rank_normalise(np.array([3.0, 1.0, np.nan, 2.0])).round(3).tolist()
    [1.0, 0.333, 0.0, 0.667]
    """
    s = np.asarray(scores, dtype=np.float64)
    n = len(s)
    rank = np.full(n, float(max(n - 1, 0)))
    scored = ~np.isnan(s)
    if scored.any():
        uniq, inverse, counts = np.unique(-s[scored], return_inverse=True, return_counts=True)
        first = np.cumsum(counts) - counts
        rank[scored] = (first + (counts - 1) / 2.0)[inverse]
    if method == "linear":
        return 1.0 - rank / (n - 1) if n > 1 else np.ones(n)
    if method == "rrf":
        return (rrf_k + 1.0) / (rrf_k + rank + 1.0)
    raise ValueError(f"unknown rank normalisation {method!r}; use 'linear' or 'rrf'")


def fuse(
    columns: Mapping[str, np.ndarray], weights: Mapping[str, float], n: int,
    method: Normalisation = "linear", rrf_k: float = 60.0,
) -> tuple[np.ndarray, dict[str, float]]:
    """(final scores, weights actually used, renormalised to sum 1) for ``n`` candidates."""
    used = {
        name: float(w) for name, w in weights.items()
        if w > 0 and name in columns and not np.isnan(np.asarray(columns[name], dtype=np.float64)).all()
    }
    if not used or n == 0:
        return rank_normalise(-np.arange(n, dtype=np.float64)), {}  # keep the current order
    total = sum(used.values())
    used = {name: w / total for name, w in used.items()}
    final = sum(w * rank_normalise(columns[name], method, rrf_k) for name, w in used.items())
    return np.asarray(final, dtype=np.float64), used


def most_refined(names: Sequence[str]) -> str | None:
    """The last of ``FUSED_STAGES`` among ``names`` (``llm`` over ``coarse`` over ``recall``)."""
    present = [s for s in FUSED_STAGES if s in names]
    return present[-1] if present else None


def fused_stage_names(stages: Sequence[StageSpec]) -> list[str]:
    """The enabled scored stages that run before fusion, in pipeline order."""
    names: list[str] = []
    for spec in stages:
        if spec.kind == "fusion":
            break
        if spec.enabled and spec.name in FUSED_STAGES:
            names.append(spec.name)
    return names


def weights_key_for(stages: Sequence[StageSpec], ruleset_path: Callable[[str | None], Path]) -> str:
    """Names everything tuned weights depend on: ``<stages>-<digest>``, e.g. ``recall+coarse-3f2a9c01d4e5``.

    ``stages`` is the whole pipeline; ``ruleset_path`` gives a policy stage's rule set file from
    its ``params.ruleset`` (``rules.config.RulesConfig.ruleset_path``; ``cascade.registry.weights_key``
    passes both from the settings). The digest covers the scored stages, every enabled stage's
    kind, depth and params, and each policy stage's rule set (its file's bytes), so weights
    tuned under one rule set or candidate depth are never served under another: a change gives
    a new key, and the next ``recsys train``/``eval`` tunes for it (``jobs.train``) while serving
    falls back to the most refined stage's order.
    """
    fused = fused_stage_names(stages)
    parts: list[Any] = [fused, list(FUSED_COLUMNS)]  # weights tuned over other columns are not reused
    for spec in stages:
        if not spec.enabled:
            continue
        part: list[Any] = [spec.name, spec.kind, spec.depth]
        if spec.kind in POLICY_KINDS:
            path = Path(ruleset_path(spec.params.get("ruleset")))
            part += [sorted(spec.params.items()), file_sha256(path) if path.is_file() else f"missing:{path}"]
        elif spec.params:  # e.g. coarse served from coarse_tags/: other scores, other weights
            part.append(sorted(spec.params.items()))
        parts.append(part)
    digest = hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:12]
    return f"{'+'.join(fused) or 'none'}-{digest}"


class FusionStage:
    """``recsys.contract.Stage`` writing ``final``, sorting by it and cutting to ``k``."""

    reads: tuple[str, ...] = FUSED_COLUMNS
    writes: tuple[str, ...] = (FINAL,)

    def __init__(self, spec: StageSpec, config: FusionConfig, *, weights_key: str):
        """``config`` is ``settings.fusion`` (``spec.params`` override its keys); ``weights_key`` names
        this pipeline's tuned weights (``cascade.registry.weights_key``)."""
        self.name = spec.name
        self.spec = spec
        self.weights_key = weights_key
        self.config = FusionConfig.model_validate({**config.model_dump(), **spec.params})
        self.reads = tuple(self.config.weights or FUSED_COLUMNS)
        self.tuned = False  # whether weights.json tuned for this exact pipeline was found

    def load(self, artifact_dir: Any) -> None:
        """Use the weights tuned for this pipeline's scored stages when present, else the configured ones.

        Tuned weights live in ``artifact_dir/fusion/<key>/weights.json`` with ``key`` the
        enabled scored stages before fusion (``recall+coarse`` or ``recall+coarse+llm``), so
        pipelines with and without the LLM keep their own weights side by side.
        """
        directory = Path(artifact_dir) / "fusion" / self.weights_key
        if directory.is_dir():  # checked against its digests before it is read (recsys.manifest)
            verify_directory(directory)
        tuned = load_weights(directory, self.config.tuned)
        if tuned is not None:
            self.config = self.config.model_copy(update={"weights": FusionConfig(weights=tuned).weights})
            self.reads = tuple(self.config.weights or ())
            self.tuned = True

    def version(self) -> str:
        weights = sorted(self.config.weights.items()) if self.config.weights is not None else "most-refined"
        blob = json.dumps([weights, self.config.normalisation, self.config.rrf_k])
        return hashlib.sha1(blob.encode()).hexdigest()[:12]

    def weights_for(self, candidates: Candidates) -> dict[str, float]:
        """The configured or tuned weights; without any, the most refined stage scored here."""
        if self.config.weights is not None:
            return self.config.weights
        scored = [s for s in FUSED_STAGES if s in candidates.scores and not np.isnan(candidates.scores[s]).all()]
        top = most_refined(scored)
        return {top: 1.0} if top is not None else {}

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        weights = self.weights_for(candidates)
        columns = {name: candidates.scores[name] for name in weights if name in candidates.scores}
        final, _ = fuse(columns, weights, len(candidates), self.config.normalisation, self.config.rrf_k)
        # no cut here: the pipeline applies this stage's depth and finally request.k, and a
        # caps stage after fusion needs the whole fused order to fill k after dropping items
        return candidates.with_scores(FINAL, final)


def save_weights(directory: Path, weights: Mapping[str, float], **meta: Any) -> Path:
    """Write ``directory/weights.json`` atomically ({"weights": ..., plus ``meta``})."""
    FusionConfig(weights=dict(weights))  # refuse invalid weights before writing
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"weights": dict(weights), **meta}, indent=2, sort_keys=True)
    return atomic_write_text(directory / WEIGHTS_FILE, text)


def load_weights(directory: Path, which: str = "checked") -> dict[str, float] | None:
    """The tuned weights in ``directory/weights.json`` (``which``: see ``FusionConfig.tuned``)."""
    path = Path(directory) / WEIGHTS_FILE
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("weights"), dict):
        raise ValueError(f"{path}: expected {{'weights': {{stage: weight}}}}")
    key = "grid_best" if which == "grid_best" and isinstance(data.get("grid_best"), dict) else "weights"
    return {str(k): float(v) for k, v in data[key].items()}
