"""How much the EASE L2 penalty matters per dataset, and whether valid picks it.

``python -m bench.ease_l2 --data DIR [DIR ...] --artifacts DIR --out FILE`` prepares each dataset
(``jobs.prepare``, the default protocol, its split reused when unchanged) and fits the EASE item
model (``recall.ease_l2``; the ``ease`` baseline of every eval report and the recall stage's
item-model channel use the same fit) at every penalty of a grid, on what each phase may see. Per
penalty: NDCG@10 on the valid targets and on the test targets. Per dataset: the penalty valid
picks, its test NDCG@10 against the default's with the paired bootstrap CI over the test users,
and the mean number of users per item (the Gram diagonal the penalty is added to), the scale a
rule that sizes the penalty to the data would read.

The test columns are for reading, never for choosing: a penalty picked on them is an optimistic
ceiling of the baseline, not a setting.

Deliberately left out: the cascade (recall, coarse) at each penalty, which needs a full eval per
value; item-kNN (``ease_max_items`` and above).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from jobs.evaluation.baselines import ease_channel, neighbour_rankings, visible_sequences
from jobs.prepare import prepare
from offline.baselines import input_histories
from offline.bootstrap import paired_bootstrap
from offline.metrics import per_user_metrics
from offline.split import Phase, Split
from recall.config import RecallConfig
from recsys.provenance import write_result

K = 10
GRID = (20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0)


def ease_ndcg(split: Split, phase: Phase, l2: float) -> np.ndarray:
    """Per-user NDCG@10 of the EASE baseline at penalty ``l2`` on ``phase``'s targets."""
    seqs = visible_sequences(split, phase)
    channel = ease_channel(split, phase, RecallConfig(ease_l2=l2), seqs)
    rankings = neighbour_rankings(channel, input_histories(split, phase), split.item_popularity(phase), K)
    return per_user_metrics(rankings, split.targets(phase), K)[f"ndcg@{K}"]


def sweep(split: Split, grid: tuple[float, ...] = GRID, default: float | None = None) -> dict[str, Any]:
    """Valid and test NDCG@10 per penalty; the valid pick against ``default`` on the test users."""
    default = RecallConfig().ease_l2 if default is None else default
    grid = tuple(sorted({*grid, default}))
    valid = {l2: ease_ndcg(split, "valid", l2) for l2 in grid}
    test = {l2: ease_ndcg(split, "test", l2) for l2 in grid}
    picked = max(grid, key=lambda l2: (float(valid[l2].mean()), -abs(np.log(l2 / default))))
    versus = paired_bootstrap(test[default], test[picked], seed=0)
    counts = np.bincount(split.train["item_idx"].to_numpy(), minlength=split.n_items)
    return {
        "users": split.n_users, "items": split.n_items, "users_per_item": round(float(counts.mean()), 2),
        "default": default, "valid_pick": picked,
        "grid": {str(l2): {"valid": round(float(valid[l2].mean()), 5), "test": round(float(test[l2].mean()), 5)}
                 for l2 in grid},
        "pick_vs_default_test": {"delta": round(float(versus["mean"]), 5),
                                 "ci95": [round(float(c), 5) for c in versus["ci95"]]},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ease_l2", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, nargs="+", required=True, help="Dataset folders (any known layout).")
    parser.add_argument("--artifacts", type=Path, required=True, help="Where each dataset's split is prepared.")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    for data in args.data:
        if not data.is_dir():
            parser.exit(2, f"--data {data}: no such directory\n")
    runs = {}
    for data in args.data:
        split = prepare(data, args.artifacts / data.resolve().name)
        runs[data.resolve().name] = sweep(split)
        print(f"{data.name}: {runs[data.resolve().name]}", file=sys.stderr, flush=True)
    write_result(args.out, {"datasets": runs}, data=args.data)


if __name__ == "__main__":
    main()
