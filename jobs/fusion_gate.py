"""The fusion gate: which weights fusion serves, tuned on the *valid* phase (never test).

``tune_fusion`` captures every eligible valid user's candidates where fusion reads them
(``fit_gate``) and hands them to the fusion stage's training (``fusion.train.fit_weights``), whose
gate decides: coarse's order unless choosing from the weight grid -- every column alone, the
LLM's and the item model's included, and every mixture -- beats it on users who took no part in
the choice (seeded folds, pooled) with a paired CI above zero. Users whose valid item
trained the served LLM are left out (``llm_trained_users``).

Deliberately left out: measuring the served pipeline (``jobs.evaluation.evaluate``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cascade.registry import build_pipeline, weights_key
from cascade.settings import Settings
from fusion.stage import save_weights
from fusion.train import FusionExample, fit_weights
from jobs.evaluation.cascade_run import requests_for_user
from llm_rerank.meta import read_train_meta
from offline.protocol import SALT_FUSION, user_sample
from offline.split import Split
from recsys.contract import Candidates, ServedModel
from recsys.progress import progress_bar


def tune_fusion(settings: Settings, artifact_dir: Path, split: Split, *, progress: bool = True) -> dict[str, Any]:
    """Pick fusion weights on the *valid* phase and save them to ``artifact_dir/fusion``.

    Every valid user whose valid item no stage learnt from is one example (``fit_gate``); above
    ``fusion.tune_users`` of them, a seeded sample of that many. The test phase is never read.
    """
    pipeline = gate_pipeline(settings, artifact_dir)
    held = llm_trained_users(pipeline)  # their valid item trained the LLM: tuning on them would flatter it
    trainable = split.valid_trainable()  # a new item of the cold-item protocol is never learnt from
    eligible = np.array([u for u in range(split.n_users) if u not in held and trainable[u]], dtype=np.int64)
    requests = [requests_for_user(split, int(u), "valid")
                for u in user_sample(eligible, settings.fusion.tune_users, settings.seed, salt=SALT_FUSION)]
    gate = fit_gate(pipeline, split, requests, settings, progress=progress)
    single, best = gate["single_stage_valid_ndcg"], gate["valid_ndcg@10"]
    save_weights(Path(artifact_dir) / "fusion" / weights_key(settings), gate["weights"], valid_ndcg_at_10=best,
                 single_stage_valid_ndcg=single, grid_best=gate["grid_best"], mixture_check=gate["mixture_check"],
                 valid_users=len(requests), excluded_llm_training_users=len(held))
    return {"weights": gate["weights"], "key": weights_key(settings), "valid_ndcg@10": round(best, 5),
            "valid_users": len(requests), "excluded_llm_training_users": len(held),
            "grid_best": gate["grid_best"], "mixture_check": gate["mixture_check"],
            "single_stage_valid_ndcg@10": {s: round(v, 5) for s, v in single.items()}}


def gate_pipeline(settings: Settings, artifact_dir: Path) -> Any:
    """The pipeline up to the stage whose candidates fusion reads (the one before ``fusion``), as the
    valid phase sees it (``cascade.registry.build_pipeline``: no model that learnt the valid items)."""
    names = [s.name for s in settings.pipeline.stages if s.enabled]
    before_fusion = names[names.index("fusion") - 1] if "fusion" in names else names[-1]
    return build_pipeline(settings, artifact_dir, only=tuple(names[: names.index(before_fusion) + 1]),
                          phase="valid").without_budgets()  # the weights must not depend on the machine's load


def fit_gate(pipeline: Any, split: Split, requests: list[Any], settings: Settings, *,
             progress: bool = False) -> dict[str, Any]:
    """Fusion weights from valid ``requests`` (the caller picks which users count).

    Each request's candidates are captured where fusion would read them (after the stage before
    ``fusion``, or the pipeline's last stage), then ``gate_weights`` picks what fusion serves:
    the light path's order (coarse's) unless the grid's choice beats it on users who took no part
    in it, with a CI above zero. Ranks are normalised as the served stage does
    (``settings.fusion.normalisation``). Returns the weights, ``valid_ndcg@10``, the
    single-stage NDCGs, the grid's best, the check and the ``captured`` candidates.
    """
    names = [spec.name for spec, _ in pipeline.stages if spec.enabled]
    before = names[names.index("fusion") - 1] if "fusion" in names else names[-1]
    captured: list[Candidates] = []
    for req in progress_bar(requests, desc="fusion (valid)", enabled=progress, unit="user"):
        pipeline.run(req, until=before, observe=lambda name, c: captured.append(c) if name == before else None)
    targets = [int(split.valid[r.user_idx]) for r in requests]
    examples = [FusionExample.from_candidates(c, [t]) for c, t in zip(captured, targets, strict=True)]
    return {**fit_weights(examples, settings.fusion, settings.seed), "captured": captured}




def llm_trained_users(pipeline: Any) -> set[int]:
    """Users whose valid item trained the served LLM (``valid_users`` in its ``train_meta.json``)."""
    held: set[int] = set()
    for spec, stage in pipeline.stages:
        location = stage.model_location if isinstance(stage, ServedModel) else ""
        meta = read_train_meta(location) if spec.kind == "llm" and spec.enabled and location else None
        if meta is not None:
            held.update(int(u) for u in meta.get("valid_users", []))
    return held


