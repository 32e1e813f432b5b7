"""Builds a ``Pipeline`` from settings: imports only the configured stage kinds, then loads them.

Called once at start-up by the server, the evaluator and the CLI; never per request.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from cascade.settings import Settings
from recsys.config import STAGE_KINDS, StageSpec
from recsys.contract import Stage
from recsys.pipeline import Pipeline


def stage_class(kind: str) -> type:
    """Import the class behind ``kind`` (``module:Class`` in ``STAGE_KINDS``)."""
    try:
        module_name, cls_name = STAGE_KINDS[kind].split(":")
    except KeyError:
        raise ValueError(f"unknown stage kind {kind!r}; known kinds: {sorted(STAGE_KINDS)}") from None
    return getattr(importlib.import_module(module_name), cls_name)


def build_stage(spec: StageSpec, settings: Settings) -> Stage:
    stage = stage_class(spec.kind)(spec, settings)
    if not isinstance(stage, Stage):
        raise TypeError(f"{STAGE_KINDS[spec.kind]} does not implement recsys.contract.Stage")
    return stage


def build_pipeline(
    settings: Settings, artifact_dir: Path, *, load: bool = True, only: tuple[str, ...] | None = None
) -> Pipeline:
    """Construct every enabled stage (disabled ones are kept, unloaded, for the trace).

    ``only`` keeps just the named stages (e.g. recall + coarse to produce LLM training data).
    """
    pairs: list[tuple[StageSpec, Stage]] = []
    for spec in settings.pipeline.stages:
        if only is not None and spec.name not in only:
            continue
        stage = build_stage(spec, settings)
        if load and spec.enabled:
            stage.load(Path(artifact_dir))
        pairs.append((spec, stage))
    return Pipeline(pairs, request_budget_ms=settings.pipeline.request_budget_ms)
