"""How cost grows: train and evaluate the cascade on synthetic data of growing size.

``python -m bench.scaling --interactions 100000 1000000 5000000 --out results/bench/scaling_synthetic.json``
generates, for each size, the synthetic dataset with about ``EVENTS_PER_USER`` events per
user and one item per ``USERS_PER_ITEM`` users (so the catalog grows with the data), then in
a fresh child process (so each size's peak memory is its own): generates the data (timed
apart as ``generate_s``: the benchmark's own cost, not the system's), splits it, trains every
default stage (``jobs.train.train_stages``) and runs the test requests of a seeded sample of
``--eval-users`` users through the cascade (``jobs.evaluation.cascade_run.run_cascade``). Per size it
reports the interactions actually generated, per-stage training seconds, eval seconds and
the p50 milliseconds per request, NDCG@10 per stage and candidate recall on the sample, the
process's peak RSS and each stage's peak RSS (sampled every 0.2 s), and the ratios to the
smallest size beside the ratio of interactions, so growth faster than linear stands out, and
each stage's growth exponent (``growth_exponents``: the slope of log seconds on log interactions).

``--data DIR`` measures one real dataset instead of the synthetic sizes. ``--two-tower-logits N``
caps each two-tower fit at N softmax logits (``recall.max_train_logits``) so a size fits in
time; the report then says the fits were capped (``capped``, and per size what stopped each
fit). ``--ray ADDRESS`` (``local:2``: a 2-worker instance started here) also runs co-visitation/
item-model counting, coarse training and the evaluation pass on the cluster beside the
in-process runs (``bench.engines``: seconds, peak memory per worker, results and whether they
are equal), with no coarse cold-item training so each engine makes one fit.

Training-time measurements read at most 10,000 sampled users past that size
(``recall.tune_users``, ``coarse.max_train_users`` / ``max_valid_users``, ``fusion.tune_users``),
so their cost stops growing with users there; the coarse report says how many it sampled.

Deliberately left out: the LLM stage (its cost is per request, see ``recsys bench llm``) and
repeated runs per size (``recsys eval --seeds`` measures the spread).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.engines import compare_engines
from cascade.registry import build_pipeline
from cascade.settings import Settings
from jobs.evaluation.cascade_run import requests_for_user, run_cascade, slice_table
from jobs.train import DEFAULT_STAGES, train_stages
from offline.loaders import load_dataset
from offline.metrics import candidates_found
from offline.protocol import SALT_SCALING_EVAL, make_split, user_sample
from recsys.cluster import ClusterConfig, ClusterError, parse_address
from recsys.provenance import write_result

EVENTS_PER_USER = 40  # offline.synthetic's default mean_sessions x mean_session_len
USERS_PER_ITEM = 2
EVAL_USERS = 5000  # test users evaluated per size (a seeded sample above this; the per-user cost is the figure)
SCORED_STAGES = ("recall", "coarse")


class PeakRss:
    """Peak resident memory (MiB) of this process between ``mark`` calls, sampled in a thread."""

    def __init__(self, every_s: float = 0.2) -> None:
        self.every_s, self.current, self._stop = every_s, 0.0, threading.Event()
        self._lock, self._period = threading.Lock(), 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            period = self._period
            sample = _rss_mib()
            with self._lock:  # a sample taken before a mark belongs to the period that mark closed
                if period == self._period:
                    self.current = max(self.current, sample)
            time.sleep(self.every_s)

    def mark(self) -> float:
        """The peak since the previous mark (or start); resets it."""
        with self._lock:
            self._period += 1
            peak, self.current = max(self.current, _rss_mib()), 0.0
        return round(peak, 1)


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def measure_one(interactions: int, artifact_dir: Path, config: Path | None = None,
                eval_users: int | None = EVAL_USERS, data: Path | None = None,
                overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Generate (or load ``data``), split, train and evaluate one size in this process; the size's row.

    ``overrides``: settings sections merged over ``config`` (``bench_settings``); with a ``ray``
    address among them the three stages of ``bench.engines`` also run on the cluster (``engines``)."""
    settings = bench_settings(config, overrides or {})
    rss = PeakRss()
    t0 = time.perf_counter()
    if data is not None:
        ds = load_dataset(data)
    else:
        n_users = max(interactions // EVENTS_PER_USER, 10)
        ds = load_dataset(None, None, n_users=n_users, n_items=max(n_users // USERS_PER_ITEM, 100), seed=settings.seed)
    t1 = time.perf_counter()
    split = make_split(ds, k_core=5)
    split.save(Path(artifact_dir) / "split")
    row: dict[str, Any] = {"target_interactions": interactions, "interactions": int(len(split.train)) + 2 * split.n_users,
                           "users": split.n_users, "items": split.n_items,
                           "generate_s": round(t1 - t0, 1), "split_s": round(time.perf_counter() - t1, 1),
                           "prepare_peak_mib": rss.mark()}
    del ds
    row["train_s"], row["train_peak_mib"] = {}, {}
    fits: dict[str, Any] = {}
    for stage in DEFAULT_STAGES:
        # in this process whatever settings.ray says: the cluster side is compare_engines'
        report = train_stages(settings.model_copy(update={"ray": ClusterConfig()}), artifact_dir, split,
                              stages=(stage,), progress=False)
        fits[stage] = report[stage]
        row["train_s"][stage] = report[stage].get("seconds")
        row["train_peak_mib"][stage] = rss.mark()
    targets = np.asarray(split.targets("test"))
    users = user_sample(np.flatnonzero(targets >= 0), eval_users, settings.seed, salt=SALT_SCALING_EVAL)
    t2 = time.perf_counter()
    pipeline = build_pipeline(settings, artifact_dir)
    run = run_cascade(pipeline, split, "test", progress=False,
                      requests=[requests_for_user(split, int(u), "test") for u in users])
    table = slice_table(run["tops"], targets[users], [*SCORED_STAGES, "final"], seed=settings.seed, n_boot=200)
    row.update(eval_users=int(len(users)), eval_s=round(time.perf_counter() - t2, 1),
               eval_ms_per_user_p50=round(float(np.median(run["total_ms"])), 2), eval_peak_mib=rss.mark())
    # the system's peak: training and eval, not the generator's (its own figure is prepare_peak_mib)
    row["peak_rss_mib"] = max(*row["train_peak_mib"].values(), row["eval_peak_mib"])
    row["ndcg10"] = {k: v["ndcg@10"] for k, v in table["stages"].items()}
    row["candidate_recall"] = {"depth": next((s.depth for s in settings.pipeline.stages if s.kind == "recall"), None),
                               "recall": round(float(candidates_found(run["candidates"]["recall"], targets[users]).mean()), 5)}
    row["two_tower_cap"] = {"max_train_logits": settings.recall.max_train_logits,
                            "fits": _two_tower_stops(fits)}
    if settings.ray.address is not None:
        row["engines"] = compare_engines(settings, artifact_dir, split, users, fits["coarse"])
    return row


def bench_settings(config: Path | None, overrides: dict[str, Any]) -> Settings:
    """``config``'s settings with ``overrides`` (``{section: {field: value}}``) validated over them."""
    settings = Settings.from_yaml(config)
    update = {}
    for name, fields in overrides.items():
        section = getattr(settings, name)
        update[name] = type(section).model_validate({**section.model_dump(), **fields})
    return settings.model_copy(update=update)


def run_overrides(two_tower_logits: float | None, ray: str | None) -> dict[str, Any]:
    """The settings a run changes, stated in its report: the two-tower's logit budget (a capped fit,
    so each size fits in time), and with a cluster its address and no cold-item training (one
    coarse fit per engine instead of one per ``coarse_rank.cold_training.cold_item_variants``).

    >>> run_overrides(2e8, None)
    {'recall': {'max_train_logits': 200000000.0}}
    """
    out: dict[str, Any] = {}
    if two_tower_logits is not None:
        out["recall"] = {"max_train_logits": two_tower_logits}
    if ray is not None:
        out["ray"] = {"address": ray}
        out["coarse"] = {"cold_item_dropout": 0.0, "young_item_copies": 0.0}
    return out


def _two_tower_stops(fits: dict[str, Any]) -> dict[str, Any]:
    """What each two-tower fit's report says of its stop (``stopped_by``, epochs, steps), per model."""
    return {stage: {k: rep.get(k) for k in ("stopped_by", "epochs", "best_epoch", "steps")}
            for stage, rep in fits.items() if stage.startswith("recall") and isinstance(rep, dict)}


def growth_exponents(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Per stage, the slope b of ``log(seconds) = a + b log(interactions)`` fitted over the rows (1 =
    linear, 2 = quadratic); None with fewer than two sizes.

    >>> growth_exponents([{"interactions": 10, "train_s": {"a": 2.0}, "eval_s": 1.0},
    ...                   {"interactions": 1000, "train_s": {"a": 200.0}, "eval_s": 10.0}])
    {'a': 1.0, 'eval': 0.5}
    """
    series: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        for stage, sec in {**r.get("train_s", {}), "eval": r.get("eval_s")}.items():
            if sec:
                series.setdefault(stage, []).append((np.log(r["interactions"]), np.log(sec)))
    out: dict[str, float | None] = {}
    for stage, pts in series.items():
        x, y = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
        out[stage] = round(float(np.polyfit(x, y, 1)[0]), 2) if len(set(x.tolist())) > 1 else None
    return out


def growth(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row's cost as a multiple of the first row's, beside its multiple of interactions.

    >>> growth([{"interactions": 10, "train_s": {"a": 2.0}, "eval_ms_per_user_p50": 1.0, "peak_rss_mib": 100.0},
    ...         {"interactions": 100, "train_s": {"a": 30.0}, "eval_ms_per_user_p50": 5.0, "peak_rss_mib": 150.0}])[1]
    {'interactions_x': 10.0, 'train_s_x': {'a': 15.0}, 'eval_ms_per_user_x': 5.0, 'peak_rss_x': 1.5}
    """
    base = rows[0]

    def ratio(a: Any, b: Any) -> float | None:
        return round(a / b, 2) if a is not None and b else None

    return [{"interactions_x": ratio(r["interactions"], base["interactions"]),
             "train_s_x": {k: ratio(v, base["train_s"].get(k)) for k, v in r["train_s"].items()},
             "eval_ms_per_user_x": ratio(r["eval_ms_per_user_p50"], base["eval_ms_per_user_p50"]),
             "peak_rss_x": ratio(r["peak_rss_mib"], base["peak_rss_mib"])} for r in rows]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.split("\n\n")[0])
    parser.add_argument("--interactions", type=int, nargs="+", default=[100_000, 1_000_000, 5_000_000])
    parser.add_argument("--data", type=Path, default=None,
                        help="A dataset directory to measure instead of the synthetic sizes (one row).")
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts/scaling"))
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--eval-users", type=int, default=EVAL_USERS,
                        help="Test users evaluated per size (seeded sample); the per-user time is comparable.")
    parser.add_argument("--two-tower-logits", type=float, default=None,
                        help="Cap each two-tower fit at this many softmax logits (recall.max_train_logits); the "
                        "report then says the fits were capped. Default: the config's (no cap).")
    parser.add_argument("--ray", default=None, metavar="ADDRESS",
                        help="Also run co-visitation/item-model counting, coarse training and the evaluation pass "
                        "on this Ray cluster ('local:2' starts one here) and report both engines side by side.")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # child mode: measure one size, print JSON
    args = parser.parse_args(argv)
    if args.ray is not None:
        try:
            parse_address(args.ray)
        except ClusterError as exc:
            parser.error(str(exc))
    overrides = run_overrides(args.two_tower_logits, args.ray)
    if args.one is not None:
        print(json.dumps(measure_one(args.one, args.artifacts / f"n{args.one}", args.config, args.eval_users,
                                     data=args.data, overrides=overrides)))
        return
    rows = []
    for n in [0] if args.data is not None else sorted(args.interactions):
        cmd = [sys.executable, "-m", "bench.scaling", "--one", str(n), "--artifacts", str(args.artifacts),
               "--out", str(args.out), "--eval-users", str(args.eval_users),
               *(["--config", str(args.config)] if args.config else []),
               *(["--data", str(args.data)] if args.data else []),
               *(["--two-tower-logits", str(args.two_tower_logits)] if args.two_tower_logits else []),
               *(["--ray", args.ray] if args.ray else [])]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        # the row is the child's last JSON line (Ray may print after it)
        rows.append(json.loads(next(line for line in reversed(done.stdout.splitlines()) if line.startswith("{"))))
        report = {"overrides": overrides, "capped": "recall" in overrides, "rows": rows, "growth": growth(rows),
                  "growth_exponents": growth_exponents(rows)}
        settings = bench_settings(args.config, overrides)  # written after every size: a partial report survives
        write_result(args.out, report, config=settings.model_dump(mode="json"), seeds=[settings.seed],
                     data=args.data)
        print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
