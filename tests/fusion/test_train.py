"""The fusion stage's training: the grid search ranks as the served stage does, and the gate judges its
choice on folds of the valid users that took no part in it, pooled."""

from __future__ import annotations

import numpy as np
import pytest

from fusion.train import FusionExample, gate_weights, ndcg_at_k, ndcg_per_user, simplex_grid
from offline.protocol import SALT_FUSION_GATE, gate_folds
from recsys.contract import Candidates, Request
from tests.fusion.test_stage import LLM, RECALL, cands
from tests.fusion.test_stage import stage as fusion_stage


def test_simplex_grid():
    assert simplex_grid(["recall", "coarse"], 0.5) == [
        {"recall": 0.0, "coarse": 1.0}, {"recall": 0.5, "coarse": 0.5}, {"recall": 1.0, "coarse": 0.0}]
    assert len(simplex_grid(["recall", "coarse", "llm"], 0.1)) == 66
    with pytest.raises(ValueError, match="step must divide 1"):
        simplex_grid(["recall"], 0.3)


def example(recall, coarse, relevant_pos) -> FusionExample:
    relevant = np.zeros(len(recall), dtype=bool)
    relevant[relevant_pos] = True
    return FusionExample({"recall": np.array(recall, float), "coarse": np.array(coarse, float)}, relevant)


def test_ndcg_per_grid_point_by_hand():
    # A: recall puts the target first, coarse last; B, C: the opposite (3 candidates)
    exs = [example([3, 2, 1], [1, 2, 3], 0), example([3, 2, 1], [1, 2, 3], 2), example([3, 2, 1], [1, 2, 3], 2)]
    grid = [{"recall": 1.0, "coarse": 0.0}, {"recall": 0.5, "coarse": 0.5}, {"recall": 0.0, "coarse": 1.0}]
    # rank 0 -> 1, rank 2 -> 1/log2(4) = .5; the 50/50 mix ties everything, kept in candidate order
    assert ndcg_at_k(exs, grid, k=10).tolist() == pytest.approx([2 / 3, 2 / 3, 5 / 6])
    np.testing.assert_allclose(ndcg_per_user(exs, grid, k=10), [[1, 0.5, 0.5], [1, 0.5, 0.5], [0.5, 1, 1]])
    missed = FusionExample({"recall": np.array([1.0, 2.0])}, np.zeros(2, dtype=bool))  # target not recalled
    assert ndcg_at_k([*exs, missed], grid[2:], k=10).tolist() == pytest.approx([2.5 / 4])


def test_tuning_finds_the_mixture_when_neither_stage_alone_is_best():
    # recall order 0,1,2,3,4; coarse order 4,1,2,3,0; only a mix puts item 1 first:
    # final(0) = w, final(1) = .75, final(4) = 1 - w, so 0.25 < w < 0.75 -> first grid hit is w = 0.3
    ex = example([5, 4, 3, 2, 1], [1, 4, 3, 2, 5], 1)
    best = gate_weights([ex] * 40, step=0.1)["weights"]
    assert best == pytest.approx({"recall": 0.3, "coarse": 0.7})
    s = fusion_stage(weights=best)
    out = s.run(Request(user_id="u", k=1), Candidates(items=np.arange(5), scores=dict(ex.columns)))
    assert out.items[0] == 1  # fusion reorders only; the pipeline cuts to k


def test_example_from_candidates():
    ex = FusionExample.from_candidates(cands(recall=RECALL, llm=LLM), targets=[12])
    assert sorted(ex.columns) == ["llm", "recall"]
    assert ex.relevant.tolist() == [False, False, True, False]


def _examples(target_rank: dict[str, list[int]], n_cand: int = 10) -> list:
    """One FusionExample per user: each column ranks the target at the given position. The target
    is the last candidate, so fused ties (broken in candidate order) never favour it."""
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


def test_the_gate_weighs_the_item_model_column_beside_the_stages() -> None:
    # coarse puts items 0 and 1 above the target (9), the item model items 4 and 5: each alone ranks it
    # third, and each buries the other's two mistakes, so their blend ranks it first for everyone
    def scores(order: list[int]) -> np.ndarray:
        out = np.empty(10)
        out[order] = np.arange(10, 0, -1, dtype=float)
        return out

    example = FusionExample(columns={"recall": scores([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]),
                                     "coarse": scores([0, 1, 9, 2, 3, 6, 7, 8, 4, 5]),
                                     "item_model": scores([4, 5, 9, 2, 3, 6, 7, 8, 0, 1])},
                            relevant=np.arange(10) == 9)
    gate = gate_weights([example] * 200, step=0.1, seed=0)
    assert set(gate["single_stage_valid_ndcg"]) == {"recall", "coarse", "item_model"}
    assert gate["mixture_check"]["kept"] == "mixture" and gate["mixture_check"]["ci95"][0] > 0
    assert gate["weights"].get("item_model", 0) > 0 and gate["weights"].get("coarse", 0) > 0


def test_the_gate_tests_its_choice_on_users_that_did_not_make_it() -> None:
    # recall ranks the target first for the users of one fold and one place below coarse for
    # everyone else: over all users it is ahead (the winner's curse a same-users test would serve),
    # but every other fold's choice, made with that fold's users, is judged on users it hurts
    folds = gate_folds(200, 0, salt=SALT_FUSION_GATE)
    recall = np.where(folds == 0, 0, 3)
    data = _examples({"recall": recall.tolist(), "coarse": [2] * 200})
    assert ndcg_at_k(data, [{"recall": 1.0}])[0] > ndcg_at_k(data, [{"coarse": 1.0}])[0]
    weights, check = _gate(data)
    assert weights == {"coarse": 1.0} and check["ci95"][1] < 0 and check["users"] == 200
    assert check["fold_choices"][0] == {"coarse": 1.0}  # chosen without the users recall helps
    assert all(choice != {"coarse": 1.0} for choice in check["fold_choices"][1:])


def test_the_gate_keeps_the_incumbent_below_its_minimum_sample_and_with_one_stage() -> None:
    weights, check = _gate(_examples({"recall": [0] * 30, "coarse": [3] * 30}))
    assert weights == {"coarse": 1.0} and "too few" in check["kept"]
    weights, check = _gate(_examples({"recall": [0] * 200}))
    assert weights == {"recall": 1.0} and "only stage" in check["kept"]


def test_the_gate_ranks_as_the_served_fusion_normalises() -> None:
    # on these users the grid's best mixture differs between linear and top-heavy rrf ranks: the
    # gate's grid search must use the normalisation fusion will serve with
    rng = np.random.default_rng(0)
    data = _examples({"recall": rng.integers(0, 10, 200).tolist(), "coarse": rng.integers(0, 10, 200).tolist()})
    linear = gate_weights(data, method="linear", seed=0)["grid_best"]
    rrf = gate_weights(data, method="rrf", rrf_k=1.0, seed=0)["grid_best"]
    assert linear != rrf

    def nonzero(weights: dict[str, float]) -> dict[str, float]:
        return {s: w for s, w in weights.items() if w > 0}

    for method, rrf_k, best in (("linear", 60.0, linear), ("rrf", 1.0, rrf)):
        grid = simplex_grid(["recall", "coarse"], 0.1)
        assert best == nonzero(grid[int(np.argmax(ndcg_at_k(data, grid, 10, method, rrf_k)))])  # type: ignore[arg-type]
