"""The two-tower fit in one process against data-parallel on Ray workers: same data, config and seed.

``python -m bench.two_tower_cluster --data ../shared/datasets/ml-100k --out results/bench/two_tower_ray_ml100k.json``
fits the recall stage's two-tower (``recall.train.train_two_tower`` with the settings' recall
config) twice into ``--artifacts``: once in this process on every core, once on ``--workers``
Ray Train workers of a local instance (``local:N``, one CPU each; ``recall.distributed``). Per side
it reports what the fit's report says (epochs, best epoch, steps, why it stopped, valid and test
metrics), wall seconds, CPU seconds (this process plus, on Ray, each worker's), steady-state seconds
per epoch and per optimizer step, the start-up seconds beside them and, on Ray, the milliseconds of
one gradient all-reduce (each step's communication); then the test-metric differences.
``--interactions N`` uses ``bench.scaling``'s synthetic data of about N interactions instead of
``--data``; ``--set key=value`` overrides recall settings (an epoch cap, ``max_epochs=3``, for sizes
that would not finish early stopping in time), and the report states them.

Deliberately left out: repeated seeds (the spread is ``recsys eval --seeds``'s) and a remote cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from bench.scaling import EVENTS_PER_USER, USERS_PER_ITEM
from cascade.settings import Settings
from jobs.train import recall_config, recall_depth
from offline.loaders import load_dataset
from offline.protocol import make_split
from offline.split import Split
from recall.config import RecallConfig
from recall.train import train_two_tower
from recsys.cluster import ClusterConfig, ray_session
from recsys.provenance import write_result

REPORTED = ("epochs", "best_epoch", "steps", "stopped_by", "valid", "test", "train_s")


def fit_both(split: Split, artifacts: Path, config: RecallConfig, depth: int, seed: int, workers: int
             ) -> dict[str, Any]:
    """Both fits of ``split`` (in this process, then on ``workers`` local Ray workers) and their differences."""
    out: dict[str, Any] = {}
    for side in ("single_process", "ray"):
        cluster = ClusterConfig(address=f"local:{workers}", num_workers=workers) if side == "ray" else None
        t0, cpu0 = time.perf_counter(), time.process_time()
        with ray_session(cluster or ClusterConfig()):
            report = train_two_tower(split, artifacts / side / "recall", config, progress=False, seed=seed,
                                     depth=depth, cluster=cluster)
        row = {key: report.get(key) for key in REPORTED}
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        row["cpu_s"] = round(time.process_time() - cpu0 + sum(report.get("workers", {}).get("cpu_s", [])), 1)
        row.update(per_epoch(report))
        if "workers" in report:
            row["workers"] = report["workers"]
        row["load_avg_1m"] = round(os.getloadavg()[0], 2)
        out[side] = row
    out["test_delta"] = {m: round(out["ray"]["test"][m] - out["single_process"]["test"][m], 5)
                         for m in out["ray"]["test"]}
    return out


def per_epoch(report: dict[str, Any]) -> dict[str, float | None]:
    """Steady-state seconds per epoch (an epoch's steps and its valid evaluation) from the fit's history,
    per optimizer step, and the rest of the fit's seconds (start-up: data, workers, process group).

    >>> per_epoch({"history": [{"epoch": 1, "s": 12.0}, {"epoch": 3, "s": 16.0}], "steps": 30, "epochs": 3,
    ...             "train_s": 20.0})
    {'s_per_epoch': 2.0, 's_per_step': 0.2, 'startup_s': 14.0}
    """
    history = report.get("history") or []
    if len(history) < 2 or history[-1]["epoch"] == history[0]["epoch"]:
        return {"s_per_epoch": None, "s_per_step": None, "startup_s": None}
    seconds = (history[-1]["s"] - history[0]["s"]) / (history[-1]["epoch"] - history[0]["epoch"])
    steps_per_epoch = report["steps"] / report["epochs"]
    return {"s_per_epoch": round(seconds, 3), "s_per_step": round(seconds / steps_per_epoch, 4),
            "startup_s": round(report["train_s"] - seconds * report["epochs"], 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.two_tower_cluster", description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", type=Path, help="A dataset directory (any format recsys reads).")
    source.add_argument("--interactions", type=int, help="Synthetic data of about this many interactions.")
    parser.add_argument("--workers", type=int, default=2, help="Ray Train workers (one CPU each).")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="Recall settings overrides.")
    parser.add_argument("--artifacts", type=Path, default=Path("/tmp/two_tower_cluster"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    overrides = {k: json.loads(v) for k, _, v in (s.partition("=") for s in args.set)}
    settings = Settings.from_yaml()
    config = recall_config(settings).model_copy(update=overrides)
    RecallConfig.model_validate(config.model_dump())  # a bad override is refused before any fit
    if args.data is not None:
        ds = load_dataset(args.data)
    else:
        n_users = max(args.interactions // EVENTS_PER_USER, 10)
        ds = load_dataset(None, None, n_users=n_users, n_items=max(n_users // USERS_PER_ITEM, 100), seed=settings.seed)
    split = make_split(ds, k_core=5)
    report = {"dataset": split.name, "users": split.n_users, "items": split.n_items, "train_events": len(split.train),
              "cores": len(os.sched_getaffinity(0)), "recall_overrides": overrides,
              **fit_both(split, args.artifacts, config, recall_depth(settings), settings.seed, args.workers)}
    write_result(args.out, report, config=config.model_dump(mode="json"), data=args.data, seeds=[settings.seed])
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
