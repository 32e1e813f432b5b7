"""Loading the configured stages at start-up, and which of them the server runs without.

``load_pipeline`` builds the configured pipeline and loads every enabled stage. A stage of
kind ``llm`` that fails to load does not stop the server: it is disabled (the traffic policy
then sends everyone down the light path) and replaced by an ``UnloadedStage`` that keeps
the cause, logged once as an error with the exception type, message and (unless it is a refused
digest, ``recsys.manifest``) traceback. Any other stage failing to load still fails start-up, as
one ``StageLoadError`` line naming the stage, the directory and the cause (a ``ValueError``: the
CLI prints it as one line and exits 2).

``degraded_stages`` compares the configuration with the loaded pipeline: every stage the
settings enable that the pipeline runs disabled, with the reason. ``/readyz`` lists them
(``degraded_stages``) and ``serving.online_backend`` counts them in ``/metrics``
(``recsys_stage_load_failures_total{stage}``). The worker stays ready (200) on purpose: it
answers correctly on the light path, and a 503 on every replica over an optional model would
take the whole service out of rotation; operators alert on the list and the counter.

Deliberately left out: retrying a failed load (``POST /admin/reload`` loads new artifacts).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from redis import Redis

from cascade.registry import build_pipeline, check_trained_on_split, trained_under_other_settings
from cascade.settings import Settings
from recsys.contract import Candidates, Request, StageError
from recsys.manifest import ArtifactIntegrityError
from recsys.pipeline import Pipeline

log = logging.getLogger(__name__)


class StageLoadError(ValueError):
    """A required stage's artifacts cannot be loaded; the message names the stage, the directory and the
    cause (for a damaged or missing file, the file: ``recsys.manifest.ArtifactIntegrityError``)."""


class UnloadedStage:
    """Stands in for a stage whose ``load`` raised: it keeps the cause and never runs."""

    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()

    def __init__(self, name: str, load_error: str):
        self.name = name
        self.load_error = load_error

    def load(self, artifact_dir: Path) -> None:
        raise StageError(f"stage {self.name!r} failed to load: {self.load_error}")

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        raise StageError(f"stage {self.name!r} failed to load: {self.load_error}")

    def version(self) -> str:
        return "unloaded"


@dataclass(frozen=True)
class DegradedStage:
    stage: str
    kind: str
    reason: str


def load_pipeline(settings: Settings, artifact_dir: Path, redis: Redis | None = None) -> Pipeline:
    """``build_pipeline`` whose LLM stages are disabled, not fatal, when their artifacts fail to load;
    ``redis`` is the serving worker's client, shared with the LLM stage's KV cache tier 2."""

    if not any(s.enabled and s.kind == "llm" for s in settings.pipeline.stages):
        # light path only: per-request torch work (one user vector) is tiny; intra-op threads
        # would oversubscribe the cores under concurrent requests and inflate tail latency
        import torch  # lazy: imports torch

        torch.set_num_threads(1)
    built = build_pipeline(settings, Path(artifact_dir), load=False, redis=redis)
    check_trained_on_split(built, Path(artifact_dir))  # before any load: their index errors would not say why
    if stale := trained_under_other_settings(settings, Path(artifact_dir)):
        log.warning("stage(s) %s were trained under other settings than these (a recall depth, params or section, "
                    "a coarse setting or the coarse training revision, changed since); serving them as trained: "
                    "run `recsys train` to retrain", stale)
    pairs = []
    for spec, stage in built.stages:
        if spec.enabled:
            try:
                stage.load(Path(artifact_dir))
            except Exception as exc:
                if spec.kind != "llm":
                    raise StageLoadError(load_failure(spec.name, Path(artifact_dir), exc)) from exc
                reason = f"{type(exc).__name__}: {exc}"
                # a refused digest is fully said by its one line; anything else keeps its traceback in the log
                log.error("stage %r (kind %s) failed to load from %s and is disabled; serving without it: %s",
                          spec.name, spec.kind, artifact_dir, reason,
                          exc_info=None if isinstance(exc, ArtifactIntegrityError) else exc)
                spec, stage = spec.model_copy(update={"enabled": False}), UnloadedStage(spec.name, reason)
        pairs.append((spec, stage))
    return Pipeline(pairs, request_budget_ms=built.request_budget_ms)


def load_failure(stage: str, artifact_dir: Path, exc: BaseException) -> str:
    """One line saying why ``stage`` did not load: the refused file itself, or the directory and the cause."""
    if isinstance(exc, ArtifactIntegrityError):
        return f"stage {stage!r} refused {exc}"
    return f"stage {stage!r} failed to load from {artifact_dir}: {type(exc).__name__}: {exc}"


def degraded_stages(settings: Settings, pipeline: Pipeline) -> list[DegradedStage]:
    """Stages ``settings`` enable that ``pipeline`` runs disabled (they failed to load), in order."""
    configured = {spec.name for spec in settings.pipeline.stages if spec.enabled}
    out = []
    for spec, stage in pipeline.stages:
        if spec.name in configured and not spec.enabled:
            reason = stage.load_error if isinstance(stage, UnloadedStage) else \
                "failed to load (the cause is in the server log)"
            out.append(DegradedStage(spec.name, spec.kind, reason))
    return out
