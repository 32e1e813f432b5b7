"""What the LLM tagging outputs add to the pipeline: ``offline.evaluate.evaluate_pipeline`` per variant.

Variants (same trained artifacts, same split and phase):

- ``base``: the configured pipeline;
- ``llm_channel``: the recall stage swapped for ``recall_llm`` (two-tower + popularity + the
  LLM-embedding channel at ``llm_share`` of the depth);
- ``tagged_rules``: ``rules_tagged`` in place of ``rules`` (rules see the LLM tags and the
  audience filled from them; with the packaged MovieLens rule set this measures what tag-based
  gating costs in NDCG).

Reported per variant: NDCG@10 per stage and candidate recall per stage, plus the difference to
``base``. Tag features for the coarse ranker are not a variant: the coarse ranker has no tag
feature hook yet (see the report of issue 6).

Deliberately left out: retraining anything per variant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def variant_settings(settings: Any, variant: str, llm_share: float = 0.2) -> Any:
    """``settings`` with the pipeline's stages changed for ``variant``."""
    stages = []
    for spec in settings.pipeline.stages:
        if variant == "llm_channel" and spec.kind == "recall":
            spec = spec.model_copy(update={"kind": "recall_llm", "params": {**spec.params, "llm_share": llm_share}})
        elif variant == "tagged_rules" and spec.kind == "rules":
            spec = spec.model_copy(update={"kind": "rules_tagged"})
        elif variant not in ("base", "llm_channel", "tagged_rules"):
            raise ValueError(f"unknown ablation variant {variant!r}")
        stages.append(spec)
    return settings.model_copy(update={"pipeline": settings.pipeline.model_copy(update={"stages": stages})})


def run_ablation(settings: Any, artifact_dir: Path, split: Any, *,
                 variants: tuple[str, ...] = ("base", "llm_channel", "tagged_rules"),
                 llm_share: float = 0.2, progress: bool = True) -> dict[str, Any]:
    """Evaluate each variant on the test phase; NDCG@10 and candidate recall side by side."""
    from offline.evaluate import evaluate_pipeline

    out: dict[str, Any] = {"dataset": split.name, "n_users": split.n_users, "llm_share": llm_share, "variants": {}}
    for variant in variants:
        report = evaluate_pipeline(variant_settings(settings, variant, llm_share), Path(artifact_dir), split,
                                   progress=progress, n_boot=200)
        out["variants"][variant] = {"ndcg@10": {k: v.get("ndcg@10") for k, v in report["stages"].items()},
                                    "candidate_recall": report["candidate_recall"], "versions": report["versions"]}
    base = out["variants"].get("base")
    if base:
        for v in out["variants"].values():
            v["ndcg@10_final_minus_base"] = (v["ndcg@10"].get("final") or 0) - (base["ndcg@10"].get("final") or 0)
    return out

