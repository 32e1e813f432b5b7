"""Training the fusion stage: the weights it serves, chosen on valid users' candidates.

The caller (``jobs.fusion_gate``) runs the cascade over valid users and hands in one
``FusionExample`` per user (the score columns where fusion reads them, and which candidate is
the held item); ``fit_weights`` returns what fusion serves (``gate_weights``) with its valid
NDCG@10. The gate's grid search scores ``simplex_grid``'s weight vectors per user
(``ndcg_per_user``, ranking exactly as ``FusionStage`` does).

Deliberately left out: running the cascade (the job does), writing the weights (``save_weights``).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from fusion.stage import FUSED_COLUMNS, FusionConfig, Normalisation, rank_normalise
from offline.metrics import ndcg_at_ranks
from offline.protocol import GATE_MIN_USERS, SALT_FUSION_GATE, gate_folds, gate_verdict, out_of_fold
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
    the choosing procedure -- the best of the weight grid, which holds every column alone (the
    LLM's included) and every mixture -- beats it with a paired-bootstrap 95% CI above zero on
    users that took no part in the choice.

    The users are dealt into ``GATE_FOLDS`` seeded folds; each fold's users are judged under the
    weights chosen on the other folds (``offline.protocol.out_of_fold``), and the CI is taken over
    every user pooled. Testing the best of the grid's many weight vectors on the users that
    picked it would favour whichever one fitted their noise best (the winner's curse): a grid
    search always finds *some* mixture a hair better on the users it searched (measured on
    ML-100K: +0.001 on valid, -0.0055 on test), and on a 150-user sample the best single
    stage by point estimate was recall (0.139 against coarse's 0.132, CIs overlapping); an
    expensive LLM stage must earn its place rather than win a tie. Pooled over the folds, the
    test reads every user instead of one held-out half (``docs/decisions/0021-fusion-gate-pooled-folds.md``).
    When it passes, the weights chosen on every user are served. Fewer than
    ``2 * GATE_MIN_USERS`` users never replace the incumbent; ties go to the incumbent.

    Returns ``weights``, ``single_stage_valid_ndcg`` (every user), ``grid_best`` (the grid's best
    on every user) and ``mixture_check`` (what was compared, on how many users, each fold's
    choice, the CI and the verdict).
    """
    if not examples:
        raise ValueError("gate_weights: no examples")
    present = {s for ex in examples for s in ex.columns}
    columns = [s for s in FUSED_COLUMNS if s in present]
    if not columns:
        raise ValueError(f"gate_weights: no example carries a fused column ({', '.join(FUSED_COLUMNS)})")
    alone_ndcg = ndcg_at_k(examples, [{s: 1.0} for s in columns], K, method, rrf_k)  # one pass over the users
    single = {s: float(v) for s, v in zip(columns, alone_ndcg, strict=True)}
    light = [s for s in LIGHT_STAGES if s in single]
    incumbent = light[-1] if light else max(reversed(list(single)), key=lambda s: single[s])
    alone = {incumbent: 1.0}
    if len(single) == 1:
        return {"weights": alone, "single_stage_valid_ndcg": single, "grid_best": alone,
                "mixture_check": {"kept": f"{incumbent} alone (the only stage)"}}
    if len(examples) < 2 * GATE_MIN_USERS:
        return {"weights": alone, "single_stage_valid_ndcg": single, "grid_best": alone,
                "mixture_check": {"kept": f"{incumbent} alone ({len(examples)} users are too few to test a "
                                          f"challenger on; the gate needs {2 * GATE_MIN_USERS})"}}
    options = [alone]  # the incumbent first: ties keep it
    for point in simplex_grid(columns, step):
        weights = {s: w for s, w in point.items() if w > 0}
        if weights not in options:
            options.append(weights)
    per_user = ndcg_per_user(examples, options, K, method, rrf_k)  # [option, user]

    def best_on(users: np.ndarray) -> int:
        return int(np.argmax(per_user[:, users].mean(axis=1)))  # the first on ties

    best = options[best_on(np.arange(len(examples)))]
    if best == alone:
        return {"weights": alone, "single_stage_valid_ndcg": single, "grid_best": alone,
                "mixture_check": {"vs": incumbent, "users": len(examples),
                                  "kept": f"{incumbent} alone (no weights beat it on the valid users)"}}
    chosen, procedure = out_of_fold(per_user, best_on, gate_folds(len(examples), seed, salt=SALT_FUSION_GATE))
    boot = gate_verdict(per_user[0], procedure, seed)
    name = next(iter(best)) if len(best) == 1 else "mixture"
    check = {"vs": incumbent, "challenger": name, "users": len(examples),
             "fold_choices": [options[i] for i in chosen],
             "mean": round(boot["mean"], 5), "ci95": [round(x, 5) for x in boot["ci95"]]}
    if boot["wins"]:
        check["kept"] = name if name == "mixture" else f"{name} alone"
        return {"weights": best, "single_stage_valid_ndcg": single, "grid_best": best, "mixture_check": check}
    check["kept"] = f"{incumbent} alone ({name} not significantly better on users it was not chosen on)"
    return {"weights": alone, "single_stage_valid_ndcg": single, "grid_best": best, "mixture_check": check}


class FusionExample(NamedTuple):
    """One valid user: the candidates' score columns and which candidates are relevant."""

    columns: dict[str, np.ndarray]
    relevant: np.ndarray  # bool mask aligned with the columns (all False: target not recalled)

    @classmethod
    def from_candidates(cls, candidates: Candidates, targets: np.ndarray | Sequence[int],
                        stages: Sequence[str] = FUSED_COLUMNS) -> FusionExample:
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
    """Mean NDCG@k of fusing with each weight vector of ``grid`` (one value per grid point)."""
    return ndcg_per_user(examples, grid, k, method, rrf_k).mean(axis=1)


def ndcg_per_user(examples: Sequence[FusionExample], grid: Sequence[Mapping[str, float]], k: int = 10,
                  method: Normalisation = "linear", rrf_k: float = 60.0) -> np.ndarray:
    """NDCG@k of fusing with each weight vector of ``grid`` for each example: ``[grid point, example]``.

    Ranking matches ``FusionStage``: descending final score, ties kept in candidate order.
    Examples whose relevant items were not recalled count as 0.
    """
    if not examples:
        raise ValueError("ndcg_at_k: no examples")
    stages = _stages_of(examples, grid)
    W = np.array([[float(g.get(s, 0.0)) for s in stages] for g in grid])  # [G, S]
    out = np.zeros((len(grid), len(examples)))
    for e, ex in enumerate(examples):
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
        out[:, e] = dcg / ndcg_at_ranks(np.arange(min(len(rel), k)), k).sum()  # / the ideal DCG
    return out


def _stages_of(examples: Sequence[FusionExample], grid: Sequence[Mapping[str, float]]) -> list[str]:
    names = {s for ex in examples for s in ex.columns} | {s for g in grid for s in g}
    return [s for s in FUSED_COLUMNS if s in names] + sorted(names - set(FUSED_COLUMNS))
