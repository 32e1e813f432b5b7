"""Which LLM sources the evaluated cascade served, and why: the eval report's ``llm_sources`` section.

An LLM reaches the cascade in four places, each switched on differently:

- ``coarse_llm_embedding_features``: the coarse ranker's LLM item-embedding columns, which
  training switches on for a catalog (``coarse.llm_embedding_features``; with ``auto`` only where
  they lift on valid, ``coarse_rank.llm_gate``): what the served coarse model's training report
  chose and why, with the gate's figures when it ran, per enabled coarse stage (none: ``{}``);
- ``llm_rerank``: the LLM re-ranking stage, on when the pipeline config enables it;
- ``llm_recall_channel``: the recall stage of kind ``recall_llm`` (the LLM item-embedding channel);
- ``llm_tag_rules``: a rules stage of kind ``rules_tagged`` (rules over the LLM's item tags).

The pipeline config says what is in the pipeline; the coarse model's ``meta.json`` says what its
training chose, so a reader of an eval report sees both without opening the artifacts.

Deliberately left out: the sources' effect on the metrics (the report's per-stage sections and the
ablations of ``jobs.tagging``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cascade.settings import Settings
from coarse_rank.config import stage_subdir
from coarse_rank.llm_features import LLM_EMBEDDING_FEATURES


def llm_sources(settings: Settings, artifact_dir: Path) -> dict[str, Any]:
    """The ``llm_sources`` section for ``settings``' pipeline served from ``artifact_dir``."""
    stages = [s for s in settings.pipeline.stages if s.enabled]
    coarse = [s for s in stages if s.kind == "coarse"]
    llm = [s for s in settings.pipeline.stages if s.kind == "llm"]
    return {
        "coarse_llm_embedding_features": {s.name: coarse_choice(Path(artifact_dir) / stage_subdir(s.name, dict(s.params)))
                                          for s in coarse},
        "llm_rerank": ({"on": any(s.enabled for s in llm), "why": "the pipeline config's llm stage"
                        + (" is enabled" if any(s.enabled for s in llm) else " is disabled")}
                       if llm else {"on": False, "why": "no llm stage in the pipeline"}),
        "llm_recall_channel": _in_pipeline(stages, "recall_llm"),
        "llm_tag_rules": _in_pipeline(stages, "rules_tagged"),
    }


def coarse_choice(model_dir: Path) -> dict[str, Any]:
    """What the coarse model in ``model_dir`` serves of the LLM item-embedding columns and why: its
    training report's ``llm_embedding_features`` entry, or what its feature names say when the
    report has none."""
    meta_path = Path(model_dir) / "meta.json"
    if not meta_path.is_file():
        return {"chosen": False, "why": f"no trained coarse ranker in {model_dir}"}
    meta = json.loads(meta_path.read_text())
    entry = meta.get("report", {}).get("llm_embedding_features")
    if entry is not None:
        return {key: entry[key] for key in ("chosen", "why", "valid_ndcg", "gate") if key in entry}
    chosen = any(name in LLM_EMBEDDING_FEATURES for name in meta.get("feature_names", []))
    return {"chosen": chosen, "why": "the model's feature names (its training report records no choice)"}


def _in_pipeline(stages: list[Any], kind: str) -> dict[str, Any]:
    names = [s.name for s in stages if s.kind == kind]
    return {"on": bool(names), "why": f"enabled stage {names[0]!r} of kind {kind}" if names
            else f"no enabled stage of kind {kind} in the pipeline"}
