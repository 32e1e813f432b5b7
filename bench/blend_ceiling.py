"""How far the served order could get past the EASE baseline by blending with it: an upper bound.

``python -m bench.blend_ceiling --artifacts DIR [DIR ...] --out FILE`` reads cascades trained by
``recsys eval`` (one ``DIR`` per seed, e.g. ``<artifacts>/seed-42``), runs every test user's
request through recall and coarse, and merges coarse's ranked list with the EASE baseline's
ranking over the whole catalog (the ``ease`` row of the eval report's baselines) as the fusion
stage would fuse two such columns (reciprocal-rank normalisation, weight ``w`` on EASE), at every
``w`` of a grid: ``w = 0`` is coarse's order, ``w = 1`` the baseline's. The weight is picked **on the test users
themselves**, so the best blend is an optimistic ceiling of what any fusion of the two orders
could serve, not a result: when even it does not beat EASE beyond the paired bootstrap CI, no
weight chosen on valid will.

``within_list`` is the same sweep with EASE's ranking cut to the items of coarse's list: what a
fusion stage after coarse, which reorders that list and adds nothing to it, could reach at best
(its ``w = 1`` is EASE's order of coarse's items, not the baseline).

Also reported, per seed: how often the test item is in coarse's list at all, and how many of
EASE's top-10 hits coarse's list misses (a hit the cascade cannot serve without the baseline's
candidates).

Deliberately left out: the rules and fusion stages (they serve coarse's order by default) and any
blend of scores (ranks are comparable across models, LightGBM and EASE scores are not).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench import require_cascades
from cascade.registry import build_pipeline
from cascade.settings import Settings
from fusion.stage import fuse
from jobs.evaluation.baselines import ease_channel, neighbour_rankings
from jobs.evaluation.cascade_run import run_cascade
from jobs.evaluation.seeds import mean_sd
from offline.baselines import input_histories
from offline.bootstrap import paired_bootstrap
from offline.metrics import per_user_metrics
from offline.split import Split
from recsys.provenance import write_result

K = 10
RRF_C = 60.0  # fusion.rrf_k's default
WEIGHTS = tuple(round(float(w), 2) for w in np.linspace(0.0, 1.0, 11))
EASE_DEPTH = 200  # EASE ranks read per user; an item below it adds nothing to the blend


def blend(first: np.ndarray, second: np.ndarray, w: float, k: int = K) -> np.ndarray:
    """The top ``k`` of two ranked item lists merged as the fusion stage merges score columns
    (``fusion.stage.fuse``, reciprocal-rank normalisation): ``second`` weighs ``w``, an item missing
    from a list takes that list's lowest rank, ties keep ``first``'s order, then ``second``'s.

    >>> blend(np.array([1, 2, 3]), np.array([3, 2, 1]), 0.0, 3).tolist()
    [1, 2, 3]
    >>> blend(np.array([1, 2, 3]), np.array([3, 9, 1]), 1.0, 3).tolist()
    [3, 9, 1]
    >>> blend(np.array([1, 2]), np.array([2, 1]), 0.5, 2).tolist()
    [1, 2]
    """
    items = np.concatenate([first, second[~np.isin(second, first)]])
    columns = {}
    for name, ranked in (("first", first), ("second", second)):
        rank = {int(item): r for r, item in enumerate(ranked)}
        columns[name] = np.array([-float(rank[int(i)]) if int(i) in rank else np.nan for i in items])
    final, _ = fuse(columns, {"first": 1.0 - w, "second": w}, len(items), method="rrf", rrf_k=RRF_C)
    return items[np.argsort(-final, kind="stable")][:k]


def ease_lists(split: Split, depth: int = EASE_DEPTH) -> list[np.ndarray]:
    """Each user's EASE ranking on the test phase, top ``depth``, history excluded: the baseline's own
    ranking (``jobs.evaluation.baselines.neighbour_rankings``) at a deeper cut."""
    rows = neighbour_rankings(ease_channel(split, "test"), input_histories(split, "test"),
                              split.item_popularity("test"), depth)
    return [row[row >= 0] for row in rows]


def ceiling(artifact_dir: Path, settings: Settings) -> dict[str, Any]:
    """One seed's report: NDCG@10 at every blend weight, the best (chosen on test) against coarse and
    EASE with paired CIs, and the coverage figures of the module doc."""
    split = Split.load(artifact_dir / "split")
    pipeline = build_pipeline(settings, artifact_dir, only=("recall", "coarse"), phase="test")
    run = run_cascade(pipeline, split, "test", progress=False)
    targets = split.targets("test")
    users = np.flatnonzero(targets >= 0)
    coarse = [run["kept"]["coarse"][u].sorted_by("coarse").items for u in range(split.n_users)]
    ease = ease_lists(split)
    # within the list: EASE's order of coarse's own items only (what a fusion stage after coarse can reorder)
    ease_in = [e[np.isin(e, c)] for e, c in zip(ease, coarse, strict=True)]

    def sweep(second: list[np.ndarray]) -> dict[float, np.ndarray]:
        out = {}
        for w in WEIGHTS:
            top = np.full((split.n_users, K), -1, np.int64)
            for u in users:
                merged = blend(coarse[u], second[u], w)
                top[u, :len(merged)] = merged
            out[w] = per_user_metrics(top, targets, K)[f"ndcg@{K}"][users]
        return out

    per_w, within = sweep(ease), sweep(ease_in)
    best = max(WEIGHTS, key=lambda w: (float(per_w[w].mean()), -w))
    best_in = max(WEIGHTS[:-1], key=lambda w: (float(within[w].mean()), -w))
    in_coarse = np.array([targets[u] in coarse[u] for u in users])
    ease_hit = np.array([targets[u] in ease[u][:K] for u in users])

    def versus(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
        r = paired_bootstrap(a, b, n_boot=2000, seed=int(settings.seed))
        return {"mean": round(r["mean"], 5), "ci95": [round(x, 5) for x in r["ci95"]]}

    return {"dataset": split.name, "users": int(len(users)),
            "ndcg@10": {str(w): round(float(v.mean()), 5) for w, v in per_w.items()},
            "coarse": round(float(per_w[0.0].mean()), 5), "ease": round(float(per_w[1.0].mean()), 5),
            "best_weight": best, "best": round(float(per_w[best].mean()), 5),
            "best_vs_ease": versus(per_w[1.0], per_w[best]), "best_vs_coarse": versus(per_w[0.0], per_w[best]),
            "coarse_vs_ease": versus(per_w[1.0], per_w[0.0]),
            "within_list": {"ndcg@10": {str(w): round(float(v.mean()), 5) for w, v in within.items()},
                            "best_weight": best_in, "best": round(float(within[best_in].mean()), 5),
                            "best_vs_ease": versus(per_w[1.0], within[best_in]),
                            "best_vs_coarse": versus(per_w[0.0], within[best_in])},
            "target_in_coarse_list": round(float(in_coarse.mean()), 5),
            "coarse_list_length": round(float(np.mean([len(coarse[u]) for u in users])), 1),
            "ease_top10_hits": int(ease_hit.sum()),
            "ease_top10_hits_missing_from_coarse_list": int((ease_hit & ~in_coarse).sum())}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.blend_ceiling", description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifacts", type=Path, nargs="+", required=True,
                        help="Cascades trained by recsys eval, one per seed (each with split/, recall/, coarse/).")
    parser.add_argument("--config", type=Path, default=None, help="The pipeline config they were trained with.")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    require_cascades(args.artifacts)
    runs = {}
    for directory in args.artifacts:
        base = Settings.from_yaml(args.config)
        seed = int(directory.name.removeprefix("seed-")) if directory.name.startswith("seed-") else base.seed
        runs[directory.name] = ceiling(directory, base.model_copy(update={"seed": seed}))
        print(f"{directory.name}: {runs[directory.name]}", file=sys.stderr, flush=True)
    summary = {key: mean_sd([r[key] for r in runs.values()]) for key in ("coarse", "ease", "best")}
    write_result(args.out, {"summary": summary, "runs": runs}, config=args.config,
                 seeds=[int(r.removeprefix("seed-")) for r in runs if r.startswith("seed-")] or None)


if __name__ == "__main__":
    main()
