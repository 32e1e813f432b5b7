"""The fusion gate: challengers chosen on one half of the valid users, tested on the other; users whose valid item trained the LLM stay out."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from jobs.fusion_gate import gate_weights, llm_trained_users
from offline.protocol import SALT_FUSION_GATE, gate_halves
from recsys.config import StageSpec


def _pipeline(*stages: tuple[StageSpec, object]) -> SimpleNamespace:
    return SimpleNamespace(stages=list(stages))


def test_llm_trained_users_come_from_the_served_models_train_meta(tmp_path: Path) -> None:
    served = tmp_path / "llm"
    served.mkdir()
    (served / "train_meta.json").write_text(json.dumps({"valid_users": [3, 1, 7]}))
    llm = StageSpec(name="llm", kind="llm", depth=20)
    coarse = StageSpec(name="coarse", kind="coarse", depth=50)
    stage = SimpleNamespace(model_location=str(served))
    assert llm_trained_users(_pipeline((coarse, SimpleNamespace()), (llm, stage))) == {1, 3, 7}
    disabled = llm.model_copy(update={"enabled": False})
    assert llm_trained_users(_pipeline((disabled, stage))) == set()
    # a model trained on train positives (or a base model without train_meta) holds no one out
    (served / "train_meta.json").write_text(json.dumps({"valid_users": []}))
    assert llm_trained_users(_pipeline((llm, stage))) == set()
    assert llm_trained_users(_pipeline((llm, SimpleNamespace(model_location=str(tmp_path / "base"))))) == set()


def _examples(target_rank: dict[str, list[int]], n_cand: int = 10) -> list:
    """One FusionExample per user: each column ranks the target at the given position. The target
    is the last candidate, so fused ties (broken in candidate order) never favour it."""
    from fusion.stage import FusionExample

    out = []
    target = n_cand - 1
    for u in range(len(next(iter(target_rank.values())))):
        columns = {}
        for stage, ranks in target_rank.items():
            order = list(range(n_cand - 1))
            order.insert(ranks[u], target)  # the stage's ranking, target at position ranks[u]
            score = np.empty(n_cand)
            score[order] = np.arange(n_cand, 0, -1, dtype=float)
            columns[stage] = score
        out.append(FusionExample(columns=columns, relevant=np.arange(n_cand) == target))
    return out


def _gate(examples: list, method: str = "linear") -> tuple[dict, dict]:
    gate = gate_weights(examples, step=0.1, method=method, seed=0)  # type: ignore[arg-type]
    return gate["weights"], gate["mixture_check"]


def test_the_gate_keeps_coarse_against_a_stage_better_only_by_noise() -> None:
    # recall ranks the target one place higher than coarse for 12 users and one lower for 20:
    # ahead on the mean (+0.001), not beyond the CI, and no mixture does better than recall
    recall = [1] * 12 + [3] * 20 + [2] * 168
    weights, check = _gate(_examples({"recall": recall, "coarse": [2] * 200}))
    assert weights == {"coarse": 1.0} and check["vs"] == "coarse" and check["ci95"][0] <= 0
    # the same for an LLM stage: an expensive stage must earn its place, not win a tie
    weights, _ = _gate(_examples({"recall": [4] * 200, "coarse": [2] * 200, "llm": recall}))
    assert weights == {"coarse": 1.0}


def test_the_gate_serves_a_stage_or_mixture_that_beats_coarse_beyond_the_ci() -> None:
    weights, check = _gate(_examples({"recall": [4] * 200, "coarse": [2] * 200, "llm": [0] * 190 + [2] * 10}))
    assert check["ci95"][0] > 0 and weights.get("llm", 0) > 0 and weights.get("coarse", 0) < 1
    # recall alone does better than coarse for every user: it is served
    weights, check = _gate(_examples({"recall": [0] * 200, "coarse": [3] * 200}))
    assert weights.get("recall", 0) > 0 and check["ci95"][0] > 0


def test_the_gate_tests_its_challenger_on_users_that_did_not_choose_it() -> None:
    # recall ranks the target first for every user of the half that picks the challenger and one
    # place below coarse for every user of the other half: over all users it is ahead beyond any CI
    # (the winner's curse a same-users test would serve), on the held half it is worse
    choose, confirm = gate_halves(200, seed=0, salt=SALT_FUSION_GATE)
    recall = np.full(200, 3)
    recall[choose] = 0
    weights, check = _gate(_examples({"recall": recall.tolist(), "coarse": [2] * 200}))
    assert weights == {"coarse": 1.0}
    assert check["challenger"] == "recall" and check["ci95"][1] < 0
    assert check["chosen_on_users"] == 100 and check["tested_on_users"] == 100
    assert set(choose.tolist()).isdisjoint(confirm.tolist()) and len(choose) + len(confirm) == 200


def test_the_gate_keeps_the_incumbent_below_its_minimum_sample_and_with_one_stage() -> None:
    weights, check = _gate(_examples({"recall": [0] * 30, "coarse": [3] * 30}))
    assert weights == {"coarse": 1.0} and "too few" in check["kept"]
    weights, check = _gate(_examples({"recall": [0] * 200}))
    assert weights == {"recall": 1.0} and "only stage" in check["kept"]


def test_the_gate_ranks_as_the_served_fusion_normalises() -> None:
    # on these users the grid's best mixture differs between linear and top-heavy rrf ranks: the
    # gate's grid search (on its choosing half) must use the normalisation fusion will serve with
    from fusion.stage import tune_fusion_weights

    rng = np.random.default_rng(0)
    data = _examples({"recall": rng.integers(0, 10, 200).tolist(), "coarse": rng.integers(0, 10, 200).tolist()})
    choose = [data[i] for i in gate_halves(200, seed=0, salt=SALT_FUSION_GATE)[0]]
    linear = gate_weights(data, method="linear", seed=0)["grid_best"]
    rrf = gate_weights(data, method="rrf", rrf_k=1.0, seed=0)["grid_best"]
    assert linear != rrf
    assert linear == tune_fusion_weights(choose, method="linear")
    assert rrf == tune_fusion_weights(choose, method="rrf", rrf_k=1.0)
