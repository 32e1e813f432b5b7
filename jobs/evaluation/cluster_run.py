"""The per-user evaluation pass on a Ray cluster: ``run_cascade`` over Ray Data batches of users.

``per_user_pass`` is what the evaluator calls for its one pass over every user: with no cluster
configured (``settings.ray.address`` unset) it is ``jobs.evaluation.cascade_run.run_cascade`` in
this process; with one, the users are cut into batches of consecutive rows, a pool of Ray Data
actors (``CascadeActor``: each builds and loads the pipeline once) runs ``run_cascade`` on each
batch, and ``merge_runs`` joins the batches' results in row order. Every request is answered by
the same stages with the same artifacts and no state carried between requests, so the rankings,
hence every metric computed from them, are those of the single-process pass; only the timings
differ (``tests/jobs/evaluation/test_cluster_run.py``).

Each batch's result also carries the worker's process id and peak resident memory, gathered into
``worker_peak_mib`` (what one worker needs: the loaded pipeline plus one batch's results).

Deliberately left out: the evaluator's later passes (policy costs, diagnostics), which run on
the driver over the replayed scorers of its own pipeline, and streaming results to disk.
"""

from __future__ import annotations

import os
import pickle
import resource
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cascade.registry import build_pipeline
from cascade.settings import Settings
from jobs.evaluation.cascade_run import requests_for_user, run_cascade
from offline.split import Phase, Split
from recsys.cluster import ray_session
from recsys.progress import progress_bar

BATCHES_PER_WORKER = 4  # more batches than workers, so a slow batch does not leave the others idle


class CascadeActor:
    """Ray Data callable class: loads the pipeline once per actor, runs one batch of users per call."""

    def __init__(self, settings: Settings, artifact_dir: str, split_ref: list[Any], phase: Phase) -> None:
        import ray  # lazy: heavy optional dependency; this class only runs inside Ray workers

        self.split: Split = ray.get(split_ref[0])
        self.phase = phase
        self.pipeline = build_pipeline(settings, Path(artifact_dir), phase=phase)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        users = batch["user"].astype(np.int64)
        run = run_cascade(self.pipeline, self.split, self.phase, progress=False,
                          requests=[requests_for_user(self.split, int(u), self.phase) for u in users])
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        return {"first_row": batch["row"][:1], "worker": np.array([os.getpid()]),
                "peak_mib": np.array([peak_mib]), "run": np.array([pickle.dumps(run)], dtype=object)}


def merge_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """``run_cascade`` results of consecutive batches of requests, joined as one run over all of them.

    >>> a = {"tops": {"final": np.array([[1, 2]])}, "candidates": {"recall": [np.array([1])]},
    ...      "kept": {"recall": ["c1"]}, "stage_ms": {"recall": [1.0]}, "status": {"recall": {"ok": 1}},
    ...      "total_ms": np.array([2.0]), "served": np.array([2]), "short_reasons": {}}
    >>> b = {**a, "tops": {"final": np.array([[3, 4]])}, "short_reasons": {"few": 1}}
    >>> m = merge_runs([a, b])
    >>> m["tops"]["final"].tolist(), m["status"], m["short_reasons"], m["stage_ms"]["recall"]
    ([[1, 2], [3, 4]], {'recall': {'ok': 2}}, {'few': 1}, [1.0, 1.0])
    """
    first = runs[0]
    status: dict[str, dict[str, int]] = {}
    stage_ms: dict[str, list[float]] = {}
    short: dict[str, int] = {}
    for r in runs:
        for name, counts in r["status"].items():
            for st, n in counts.items():
                status.setdefault(name, {}).setdefault(st, 0)
                status[name][st] += n
        for name, values in r["stage_ms"].items():
            stage_ms.setdefault(name, []).extend(values)
        for reason, n in r["short_reasons"].items():
            short[reason] = short.get(reason, 0) + n
    return {
        "tops": {s: np.concatenate([r["tops"][s] for r in runs]) for s in first["tops"]},
        "candidates": {s: [c for r in runs for c in r["candidates"][s]] for s in first["candidates"]},
        "kept": {s: [c for r in runs for c in r["kept"][s]] for s in first["kept"]},
        "stage_ms": stage_ms, "status": status, "short_reasons": short,
        "total_ms": np.concatenate([r["total_ms"] for r in runs]),
        "served": np.concatenate([r["served"] for r in runs]),
    }


def run_cascade_on_cluster(settings: Settings, artifact_dir: Path, split: Split, phase: Phase,
                           users: np.ndarray | None = None, progress: bool = True) -> dict[str, Any]:
    """``run_cascade`` for ``users`` (default: every user, row u = user u) on the Ray instance in use.

    One actor per training worker (``settings.ray.num_workers``); the result adds ``worker_peak_mib``
    (peak resident MiB of each worker process, by process id)."""
    import ray  # lazy: heavy optional dependency, only when a cluster is configured

    users = np.arange(split.n_users) if users is None else np.asarray(users, dtype=np.int64)
    if len(users) == 0:
        raise ValueError("run_cascade_on_cluster: no users to evaluate")
    workers = settings.ray.num_workers
    batch = max(1, -(-len(users) // (workers * BATCHES_PER_WORKER)))
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # batches come back in row order
    blocks = [pd.DataFrame({"row": np.arange(lo, min(lo + batch, len(users))), "user": users[lo:lo + batch]})
              for lo in range(0, len(users), batch)]  # one block, one call
    ds = ray.data.from_pandas(blocks).map_batches(
        CascadeActor, fn_constructor_kwargs={"settings": settings, "artifact_dir": str(artifact_dir),
                                             "split_ref": [ray.put(split)], "phase": phase},
        batch_size=None, batch_format="numpy", concurrency=min(workers, len(blocks)),
        num_cpus=settings.ray.cpus_per_worker)
    runs: list[tuple[int, dict[str, Any]]] = []
    peaks: dict[int, float] = {}
    with progress_bar(total=len(users), desc=f"eval {phase} (ray)", unit="user", enabled=progress) as bar:
        for row in ds.iter_rows():
            runs.append((int(row["first_row"]), pickle.loads(row["run"])))
            peaks[int(row["worker"])] = max(peaks.get(int(row["worker"]), 0.0), round(float(row["peak_mib"]), 1))
            bar.update(len(runs[-1][1]["total_ms"]))
    runs.sort(key=lambda r: r[0])  # row order whatever order the batches came back in
    return {**merge_runs([r for _, r in runs]), "worker_peak_mib": peaks}


def per_user_pass(pipeline: Any, settings: Settings, artifact_dir: Path, split: Split, phase: Phase,
                  progress: bool = True) -> dict[str, Any]:
    """The evaluator's pass over every user: on the configured cluster, else ``run_cascade`` here."""
    if settings.ray.address is None:
        return run_cascade(pipeline, split, phase, progress)
    with ray_session(settings.ray):
        return run_cascade_on_cluster(settings, artifact_dir, split, phase, progress=progress)
