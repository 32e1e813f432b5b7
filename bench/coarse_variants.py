"""Two coarse-ranker settings side by side on one trained recall fit: a paired, seeded comparison.

``python -m bench.coarse_variants --artifacts DIR --set coarse.item_age_features=false
--seeds 42 43 44 --out results/eval/coarse_item_age_ml100k.json`` reads the split and the two
recall models (``recall``, ``recall_holdout``) a ``recsys train`` or ``recsys eval`` left in
``DIR``, and for each seed trains the coarse ranker and the fusion weights twice in
``<DIR>/variants/<base|set>-<seed>/`` (the recall models linked, the split copied): once
with the settings as they are (``base``) and once with the ``--set`` overrides. Each pair is
measured on the test requests of every user, and the report gives per seed and variant recall,
coarse and served NDCG@10, the per-user paired delta (set minus base) with its bootstrap 95% CI,
the mean and sd over the seeds, and, where the split is a cold-item split
(``jobs.evaluation.cold_items``), the new- and warm-item slices.

Holding the recall fit fixed isolates what the coarse setting does from the two-tower's own
seed spread, and a fit of the coarse ranker costs minutes where a full ``recsys eval --seeds``
costs hours on 2 cores. Deliberately left out: the LLM stage.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from cascade.registry import build_pipeline
from cascade.settings import Settings
from jobs.evaluation.cascade_run import run_cascade
from jobs.evaluation.cold_items import item_slices
from jobs.evaluation.seeds import link_shared, mean_sd
from jobs.train import train_stages
from offline.bootstrap import paired_bootstrap
from offline.metrics import per_user_metrics
from offline.split import Split
from recsys.provenance import write_result

LINKED = ("recall", "recall_holdout")  # linked into each variant's directory, the split copied
STAGES = ("recall", "coarse", "final")


def overrides(pairs: list[str]) -> dict[str, Any]:
    """``["coarse.a=1", "coarse.b=false"]`` as a nested settings dict (values parsed as YAML).

    >>> overrides(["coarse.item_age_features=false", "seed=7"])
    {'coarse': {'item_age_features': False}, 'seed': 7}
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {pair!r}: expected section.key=value")
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return out


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def run_variant(source: Path, directory: Path, split: Split, settings: dict[str, Any]) -> dict[str, np.ndarray]:
    """Train coarse and fusion under ``settings`` beside ``source``'s recall fit; per-user NDCG@10 by stage."""
    link_shared(source, directory, LINKED)
    built = Settings.build(settings)
    train_stages(built, directory, split, stages=("coarse", "fusion"), force=True, progress=False)
    run = run_cascade(build_pipeline(built, directory, phase="test"), split, "test", progress=False)
    targets = split.targets("test")
    return {stage: per_user_metrics(run["tops"][stage], targets, 10)["ndcg@10"] for stage in STAGES}


def compare(source: Path, seeds: list[int], changed: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The report (see module doc) of ``base`` against ``base`` + ``changed`` over ``seeds``."""
    split = Split.load(source / "split")
    targets = split.targets("test")
    users = targets >= 0
    slices = item_slices(split, targets) if split.protocol.get("cold_items") else {}
    per_seed: dict[str, Any] = {}
    for seed in seeds:
        t0 = time.perf_counter()
        runs = {name: run_variant(source, source / "variants" / f"{name}-{seed}", split,
                                  _merge({**base, "seed": seed}, extra))
                for name, extra in (("base", {}), ("set", changed))}
        row: dict[str, Any] = {name: {s: round(float(m[s][users].mean()), 5) for s in STAGES} for name, m in runs.items()}
        for stage in ("coarse", "final"):
            boot = paired_bootstrap(runs["base"][stage][users], runs["set"][stage][users], n_boot=2000, seed=seed)
            row[f"delta_{stage}"] = {"mean": round(boot["mean"], 5), "ci95": [round(x, 5) for x in boot["ci95"]]}
        if slices:
            row["slices"] = {sl: {name: {s: round(float(m[s][rows].mean()), 5) for s in STAGES}
                                  for name, m in runs.items()} | {"users": int(len(rows))}
                             for sl, rows in slices.items()}
        row["seconds"] = round(time.perf_counter() - t0, 1)
        per_seed[str(seed)] = row
        print(f"seed {seed}: {row}", file=sys.stderr, flush=True)
    summary = {f"{name}_{s}": mean_sd([per_seed[str(x)][name][s] for x in seeds])
               for name in ("base", "set") for s in ("coarse", "final")}
    summary["delta_coarse"] = mean_sd([per_seed[str(x)]["delta_coarse"]["mean"] for x in seeds])
    return {"dataset": split.name, "users": int(users.sum()), "set": changed, "seeds": seeds,
            "summary": summary, "per_seed": per_seed}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.coarse_variants", description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifacts", type=Path, required=True, help="A trained artifacts directory (split, recall).")
    parser.add_argument("--set", dest="pairs", action="append", required=True, metavar="SECTION.KEY=VALUE",
                        help="A setting of the compared variant (repeatable).")
    parser.add_argument("--base", dest="base_pairs", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="A setting both variants share (repeatable), e.g. coarse.cold_item_dropout=0.")
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    missing = [sub for sub in ("split", *LINKED) if not (args.artifacts / sub).is_dir()]
    try:
        if missing:
            raise ValueError(f"{args.artifacts}: no {', '.join(missing)} (train the cascade there first)")
        changed, base = overrides(args.pairs), overrides(args.base_pairs)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    report = compare(args.artifacts, args.seeds, changed, base)
    write_result(args.out, report, seeds=args.seeds)


if __name__ == "__main__":
    main()
