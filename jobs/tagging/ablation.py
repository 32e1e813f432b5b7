"""What the LLM tagging outputs add to the pipeline: ``jobs.evaluation.evaluate.evaluate_pipeline`` per variant.

Variants (same trained artifacts, same split and phase):

- ``base``: the configured pipeline;
- ``llm_channel``: the recall stage swapped for ``recall_llm`` (two-tower + popularity + the
  LLM-embedding channel at ``llm_share`` of the depth);
- ``tagged_rules``: ``rules_tagged`` in place of ``rules`` (rules see the LLM tags and the
  audience filled from them; with the packaged MovieLens rule set this measures what tag-based
  gating costs in NDCG);
- ``tag_features``: the coarse stage loads ``coarse_tags/`` (the coarse ranker with
  ``CoarseConfig.tag_features``, see ``jobs.coarse_tags``) instead of ``coarse/``;
- ``all``: ``llm_channel`` and ``tag_features`` together.

Reported per variant: NDCG@10 per stage and candidate recall per stage, plus the difference to
``base``. Fusion keeps the weights tuned for the configured pipeline (they act on ranks, so
they apply unchanged, but are not re-tuned for the swapped stages).

Deliberately left out: retraining per variant, except ``coarse_tags/``, which
``jobs.coarse_tags.ensure_coarse_tags`` trains first when it is missing or stale.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cascade.settings import Settings
from jobs.evaluation.evaluate import evaluate_pipeline

VARIANTS = ("base", "llm_channel", "tagged_rules", "tag_features", "all")
_SWAPS = {"base": (), "llm_channel": ("llm_channel",), "tagged_rules": ("tagged_rules",),
          "tag_features": ("tag_features",), "all": ("llm_channel", "tag_features")}
NEEDS_COARSE_TAGS = ("tag_features", "all")


def variant_settings(settings: Settings, variant: str, llm_share: float = 0.2) -> Settings:
    """``settings`` with the pipeline's stages changed for ``variant``."""
    if variant not in _SWAPS:
        raise ValueError(f"unknown ablation variant {variant!r}; choose from {VARIANTS}")
    from jobs.coarse_tags import SUBDIR  # lazy: imports scipy (coarse_rank)

    swaps, stages = _SWAPS[variant], []
    for spec in settings.pipeline.stages:
        if "llm_channel" in swaps and spec.kind == "recall":
            spec = spec.model_copy(update={"kind": "recall_llm", "params": {**spec.params, "llm_share": llm_share}})
        elif "tagged_rules" in swaps and spec.kind == "rules":
            spec = spec.model_copy(update={"kind": "rules_tagged"})
        elif "tag_features" in swaps and spec.kind == "coarse":
            spec = spec.model_copy(update={"params": {**spec.params, "subdir": SUBDIR}})
        stages.append(spec)
    return settings.model_copy(update={"pipeline": settings.pipeline.model_copy(update={"stages": stages})})


def run_ablation(settings: Settings, artifact_dir: Path, split: Any, *, variants: tuple[str, ...] = VARIANTS,
                 llm_share: float = 0.2, retrain_coarse_tags: bool = False, progress: bool = True) -> dict[str, Any]:
    """Evaluate each variant on the test phase; NDCG@10 and candidate recall side by side."""
    unknown = [v for v in variants if v not in _SWAPS]
    if unknown:
        raise ValueError(f"unknown ablation variant(s) {unknown}; choose from {VARIANTS}")
    out: dict[str, Any] = {"dataset": split.name, "n_users": split.n_users, "llm_share": llm_share, "variants": {}}
    if any(v in NEEDS_COARSE_TAGS for v in variants):
        from jobs.coarse_tags import ensure_coarse_tags  # lazy: imports scipy (coarse_rank)

        tagged = ensure_coarse_tags(settings, Path(artifact_dir), split, retrain=retrain_coarse_tags,
                                    progress=progress)
        report = tagged["report"]
        out["coarse_tags"] = {"trained_now": tagged["trained"], **{
            k: v for k, v in report.items()
            if k.startswith("valid_ndcg") or k in ("best_iteration", "feature_importance_top10", "embedding")}}
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
