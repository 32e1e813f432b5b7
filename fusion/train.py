"""Training the fusion stage: the weights it serves, chosen on valid users' candidates.

The caller (``jobs.fusion_gate``) runs the cascade over valid users and hands in one
``FusionExample`` per user (the score columns where fusion reads them, and which candidate is
the held item); ``fit_weights`` returns what fusion serves (``gate_weights``) with its valid
NDCG@10. ``tune_fusion_weights`` is the grid search (``simplex_grid``, scored by ``ndcg_at_k``,
ranking exactly as ``FusionStage`` does).

Deliberately left out: running the cascade (the job does), writing the weights (``save_weights``).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from fusion.stage import FUSED_STAGES, FusionConfig, Normalisation, rank_normalise
from offline.metrics import ndcg_at_ranks
from offline.protocol import GATE_MIN_USERS, SALT_FUSION_GATE, gate_halves, gate_verdict
from recsys.contract import Candidates

K = 10  # the gate compares NDCG@10, the cut every stage is judged at
LIGHT_STAGES = ("recall", "coarse")  # the light path's stages, most refined last: the incumbent is its order


def fit_weights(examples: list[FusionExample], config: FusionConfig, seed: int) -> dict[str, Any]:
    """``gate_weights`` under ``config``'s grid step and normalisation, with the served weights'
    ``valid_ndcg@10`` on every example."""
    gate = gate_weights(examples, step=config.tune_step, method=config.normalisation, rrf_k=config.rrf_k,
                        seed=seed)
    return {**gate, "valid_ndcg@10": float(ndcg_at_k(examples, [gate["weights"]], K, config.normalisation,
                                                         config.rrf_k)[0])}


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
    light = [s for s in LIGHT_STAGES if s in single]
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


class FusionExample(NamedTuple):
    """One valid user: the candidates' score columns and which candidates are relevant."""

    columns: dict[str, np.ndarray]
    relevant: np.ndarray  # bool mask aligned with the columns (all False: target not recalled)

    @classmethod
    def from_candidates(cls, candidates: Candidates, targets: np.ndarray | Sequence[int],
                        stages: Sequence[str] = FUSED_STAGES) -> FusionExample:
        columns = {s: np.asarray(candidates.scores[s]) for s in stages if s in candidates.scores}
        return cls(columns=columns, relevant=np.isin(candidates.items, np.asarray(targets, dtype=np.int64)))


def simplex_grid(stages: Sequence[str], step: float = 0.1) -> list[dict[str, float]]:
    """Every weight vector on ``stages`` with entries in multiples of ``step`` summing to 1."""
    units = round(1.0 / step)
    if units < 1 or abs(units * step - 1.0) > 1e-9:
        raise ValueError(f"step must divide 1 evenly, got {step}")
    grid = []
    for combo in itertools.product(range(units + 1), repeat=len(stages)):
        if sum(combo) == units:
            grid.append({s: c / units for s, c in zip(stages, combo, strict=True)})
    return grid


def ndcg_at_k(examples: Sequence[FusionExample], grid: Sequence[Mapping[str, float]], k: int = 10,
              method: Normalisation = "linear", rrf_k: float = 60.0) -> np.ndarray:
    """Mean NDCG@k of fusing with each weight vector of ``grid`` (one value per grid point).

    Ranking matches ``FusionStage``: descending final score, ties kept in candidate order.
    Examples whose relevant items were not recalled count as 0.
    """
    if not examples:
        raise ValueError("ndcg_at_k: no examples")
    stages = _stages_of(examples, grid)
    W = np.array([[float(g.get(s, 0.0)) for s in stages] for g in grid])  # [G, S]
    total = np.zeros(len(grid))
    for ex in examples:
        rel = np.flatnonzero(ex.relevant)
        if len(rel) == 0:
            continue
        n = len(ex.relevant)
        R = np.zeros((len(stages), n))
        present = np.zeros(len(stages), dtype=bool)
        for j, s in enumerate(stages):
            col = ex.columns.get(s)
            if col is not None and not np.isnan(np.asarray(col, dtype=np.float64)).all():
                R[j], present[j] = rank_normalise(col, method, rrf_k), True
        Wp = W * present
        F = Wp @ R  # [G, n]; dividing by sum(Wp) would not change any order
        F[Wp.sum(axis=1) == 0] = rank_normalise(-np.arange(n, dtype=np.float64))
        f_rel = F[:, rel][:, :, None]  # [G, m, 1]
        before = np.arange(n)[None, None, :] < rel[None, :, None]
        rank = (F[:, None, :] > f_rel).sum(-1) + ((F[:, None, :] == f_rel) & before).sum(-1)
        dcg = ndcg_at_ranks(rank, k).sum(axis=1)  # each relevant item's 1/log2(rank+2) term
        total += dcg / ndcg_at_ranks(np.arange(min(len(rel), k)), k).sum()  # / the ideal DCG
    return total / len(examples)


def tune_fusion_weights(examples: Sequence[FusionExample], grid: Sequence[Mapping[str, float]] | None = None,
                        *, k: int = 10, step: float = 0.1, method: Normalisation = "linear",
                        rrf_k: float = 60.0) -> dict[str, float]:
    """The grid point with the best mean NDCG@k (the first one on ties).

    ``grid`` defaults to ``simplex_grid`` over the stages present in ``examples`` with ``step``.
    """
    if grid is None:
        grid = simplex_grid(_stages_of(examples, ()), step)
    if not grid:
        raise ValueError("tune_fusion_weights: empty grid")
    scores = ndcg_at_k(examples, grid, k, method, rrf_k)
    return {s: float(w) for s, w in grid[int(np.argmax(scores))].items()}


def _stages_of(examples: Sequence[FusionExample], grid: Sequence[Mapping[str, float]]) -> list[str]:
    names = {s for ex in examples for s in ex.columns} | {s for g in grid for s in g}
    return [s for s in FUSED_STAGES if s in names] + sorted(names - set(FUSED_STAGES))
