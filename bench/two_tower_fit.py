"""What a two-tower fit to convergence costs on one machine, and which training loss carries the cost.

``python -m bench.two_tower_fit --data ../shared/datasets/amazon-scientific --loss full sampled
--out results/bench/two_tower_converge_amazon.json`` fits the recall stage's two-tower
(``recall.train.train_two_tower``, the settings' recall config, extra channels included) once per
``--loss`` on the same split and seed, in this process on every core, each until early stopping on
the valid items. Per loss it reports epochs, best epoch, steps, what stopped the fit and whether it
converged, valid and test metrics, the fit's own training seconds, wall and CPU seconds of the
whole call, steady-state seconds per epoch and per step, and the seconds at each evaluation.

Deliberately left out: repeated seeds (``recsys eval --seeds`` measures the spread) and the
distributed fit (``bench.two_tower_cluster``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from bench.two_tower_cluster import REPORTED, per_epoch
from cascade.settings import Settings
from jobs.train import recall_config, recall_depth
from offline.loaders import load_dataset
from offline.protocol import make_split
from recall.train import train_two_tower
from recsys.provenance import write_result


def fit_per_loss(data: Path, losses: list[str], artifacts: Path, config_path: Path | None = None) -> dict[str, Any]:
    """One fit of ``data``'s two-tower per training loss (``config_path``: the pipeline YAML, default
    ``configs/pipeline.yaml``), and the dataset's shape."""
    settings = Settings.from_yaml(config_path)
    split = make_split(load_dataset(data), k_core=5)
    out: dict[str, Any] = {"dataset": split.name, "users": split.n_users, "items": split.n_items,
                           "train_events": len(split.train), "cores": len(os.sched_getaffinity(0))}
    for loss in losses:
        config = recall_config(settings).model_copy(update={"loss": loss})
        t0, cpu0 = time.perf_counter(), time.process_time()
        report = train_two_tower(split, artifacts / loss, config, progress=False, seed=settings.seed,
                                 depth=recall_depth(settings))
        row = {key: report.get(key) for key in (*REPORTED, "converged")}
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        row["cpu_s"] = round(time.process_time() - cpu0, 1)
        row.update(per_epoch(report))
        row["evaluations_s"] = [[h["epoch"], h["s"]] for h in report.get("history", [])]
        out[loss] = row
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.two_tower_fit", description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="A dataset directory (any format recsys reads).")
    parser.add_argument("--loss", nargs="+", choices=("full", "sampled"), default=["full", "sampled"],
                        help="Training losses to fit, one fit each (recall.loss).")
    parser.add_argument("--config", type=Path, help="Pipeline YAML (default configs/pipeline.yaml).")
    parser.add_argument("--artifacts", type=Path, default=Path("/tmp/two_tower_fit"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        parser.error(f"--data {args.data}: not a directory")
    report = fit_per_loss(args.data, args.loss, args.artifacts, args.config)
    write_result(args.out, report, data=args.data, seeds=[Settings.from_yaml(args.config).seed])
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
