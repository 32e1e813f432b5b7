"""The fusion gate: which weights fusion serves, tuned on the *valid* phase (never test).

``tune_fusion`` captures every eligible valid user's candidates where fusion reads them
(``fit_gate``) and ``gate_weights`` decides: coarse's order unless a challenger -- another
stage alone, the LLM's included, or the grid's best mixture -- chosen on one seeded half of
the users beats it on the other half with a paired CI above zero. Users whose valid item
trained the served LLM are left out (``llm_trained_users``).

Deliberately left out: measuring the served pipeline (``jobs.evaluate``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cascade.registry import build_pipeline, weights_key
from cascade.settings import Settings
from fusion.stage import (
    FUSED_STAGES,
    FusionExample,
    Normalisation,
    ndcg_at_k,
    save_weights,
    tune_fusion_weights,
)
from jobs.cascade_run import SCORED, K, requests_for_user
from llm_rerank.meta import read_train_meta
from offline.protocol import (
    GATE_MIN_USERS,
    SALT_FUSION,
    SALT_FUSION_GATE,
    gate_halves,
    gate_verdict,
    user_sample,
)
from offline.split import Split
from recsys.contract import Candidates
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
    return build_pipeline(settings, artifact_dir, only=tuple(names[: names.index(before_fusion) + 1]), phase="valid")


def fit_gate(pipeline: Any, split: Split, requests: list[Any], settings: Settings, *,
             progress: bool = False) -> dict[str, Any]:
    """Fusion weights from valid ``requests`` (the caller picks which users count).

    Each request's candidates are captured where fusion would read them (after the stage before
    ``fusion``, or the pipeline's last stage), then ``gate_weights`` picks what fusion serves:
    the light path's order (coarse's) unless a challenger chosen on one half of the users beats
    it on the other half with a CI above zero. Ranks are normalised as the served stage does
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
    fusion = settings.fusion
    gate = gate_weights(examples, step=fusion.tune_step, method=fusion.normalisation, rrf_k=fusion.rrf_k,
                        seed=settings.seed)
    return {**gate, "valid_ndcg@10": float(ndcg_at_k(examples, [gate["weights"]], K, fusion.normalisation,
                                                         fusion.rrf_k)[0]),
            "captured": captured}




def gate_weights(examples: list[FusionExample], *, step: float = 0.1, method: Normalisation = "linear",
                 rrf_k: float = 60.0, seed: int = 0) -> dict[str, Any]:
    """The weights the gate serves: the light path's own order (coarse's, else recall's) unless
    a challenger -- the grid's best mixture or another stage alone, the LLM's included -- beats
    it with a paired-bootstrap 95% CI above zero.

    The users are split in two seeded halves. The grid search and the choice of the best
    challenger read the first half only; the paired CI is taken on the second, which played no
    part in the choice. Testing the best of the grid's many weight vectors on the users that
    picked it would favour whichever one fitted their noise best (the winner's curse): a grid
    search always finds *some* mixture a hair better on the users it searched (measured on
    ML-100K: +0.001 on valid, -0.0055 on test), and on a 150-user sample the best single
    stage by point estimate was recall (0.139 against coarse's 0.132, CIs overlapping); an
    expensive LLM stage must earn its place rather than win a tie. Fewer than 20 users per
    half never replace the incumbent.

    Returns ``weights``, ``single_stage_valid_ndcg`` (every user), ``grid_best`` (first half)
    and ``mixture_check`` (what was compared, on how many users, the CI and the verdict).
    """
    if not examples:
        raise ValueError("gate_weights: no examples")
    present = {s for ex in examples for s in ex.columns}
    single = {s: float(ndcg_at_k(examples, [{s: 1.0}], K, method, rrf_k)[0]) for s in FUSED_STAGES if s in present}
    if not single:
        raise ValueError(f"gate_weights: no example carries a fused stage's scores ({', '.join(FUSED_STAGES)})")
    light = [s for s in SCORED if s in single and s != "llm"]
    incumbent = light[-1] if light else max(reversed(list(single)), key=lambda s: single[s])
    alone = {incumbent: 1.0}
    chosen_on, tested_on = gate_halves(len(examples), seed, salt=SALT_FUSION_GATE)
    choose, confirm = [examples[i] for i in chosen_on], [examples[i] for i in tested_on]
    if len(single) == 1:
        return {"weights": alone, "single_stage_valid_ndcg": single, "grid_best": alone,
                "mixture_check": {"kept": f"{incumbent} alone (the only stage)"}}
    if len(choose) < GATE_MIN_USERS:
        return {"weights": alone, "single_stage_valid_ndcg": single, "grid_best": alone,
                "mixture_check": {"kept": f"{incumbent} alone ({len(examples)} users are too few to test a "
                                          f"challenger on; the gate needs {2 * GATE_MIN_USERS})"}}
    grid_best = tune_fusion_weights(choose, k=K, step=step, method=method, rrf_k=rrf_k)
    challengers = [{s: 1.0} for s in single if s != incumbent]
    if sum(w > 0 for w in grid_best.values()) > 1:  # a mixture (one stage alone is already a challenger)
        challengers.append(grid_best)
    picked = ndcg_at_k(choose, challengers, K, method, rrf_k)
    best = challengers[int(np.argmax(picked))]
    a = np.array([ndcg_at_k([ex], [alone], K, method, rrf_k)[0] for ex in confirm])
    b = np.array([ndcg_at_k([ex], [best], K, method, rrf_k)[0] for ex in confirm])
    boot = gate_verdict(a, b, seed)
    name = next(iter(best)) if len(best) == 1 else "mixture"
    check = {"vs": incumbent, "challenger": name, "chosen_on_users": len(choose), "tested_on_users": len(confirm),
             "mean": round(boot["mean"], 5), "ci95": [round(x, 5) for x in boot["ci95"]]}
    if boot["wins"]:
        check["kept"] = name if name == "mixture" else f"{name} alone"
        return {"weights": best, "single_stage_valid_ndcg": single, "grid_best": grid_best, "mixture_check": check}
    check["kept"] = f"{incumbent} alone ({name} not significantly better on the held half)"
    return {"weights": alone, "single_stage_valid_ndcg": single, "grid_best": grid_best, "mixture_check": check}


def llm_trained_users(pipeline: Any) -> set[int]:
    """Users whose valid item trained the served LLM (``valid_users`` in its ``train_meta.json``)."""
    held: set[int] = set()
    for spec, stage in pipeline.stages:
        location = getattr(stage, "model_location", "")
        meta = read_train_meta(location) if spec.kind == "llm" and spec.enabled and location else None
        if meta is not None:
            held.update(int(u) for u in meta.get("valid_users", []))
    return held


