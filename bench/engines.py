"""In-process against Ray, stage by stage, on one trained cascade: seconds, worker memory, results.

``bench.scaling --ray ADDRESS`` calls ``compare_engines`` for each size after training the
cascade in-process. Three stages run twice, once in this process and once on the Ray instance
``settings.ray`` names (a local ``local:2`` instance on one machine):

- ``channels``: the co-visitation and item-model weights the recall stage fits
  (``offline.item_neighbours`` against ``offline.distributed_counts``); ``equal`` says whether
  both weight matrices match entry for entry;
- ``coarse``: the coarse ranker's training on the cluster (``coarse_rank.train.train_coarse`` with
  it, into ``coarse_ray/``) beside the served ``coarse/`` that ``jobs.train`` trained in-process
  under the same settings (``bench.scaling`` turns cold-item training off, so each is one fit); quality is the
  valid NDCG@10 each reports, which differ by the data-parallel fit's bins (see
  ``coarse_rank.cluster_training``);
- ``eval``: the per-user evaluation pass over the sampled test users (``run_cascade`` against
  ``jobs.evaluation.cluster_run.run_cascade_on_cluster``) with stage deadlines out of reach, so
  a stage past its budget on a loaded machine does not make the two passes differ;
  ``equal`` says whether every stage's top-10 matches for every user.

Each side reports wall seconds and, for the Ray side, the peak resident memory of each Ray
worker process (``WorkerRss``, sampled every 0.5 s). Deliberately left out: the two-tower's
data-parallel fit (``recsys train --ray``) and repeated runs per side.
"""

from __future__ import annotations

import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from cascade.registry import build_pipeline, recall_config
from cascade.settings import Settings
from coarse_rank.train import train_coarse
from jobs.evaluation.cascade_run import requests_for_user, run_cascade, slice_table
from jobs.evaluation.cluster_run import run_cascade_on_cluster
from jobs.train import holdout_recall
from offline import distributed_counts, item_neighbours
from offline.split import Split
from recsys.cluster import ray_session
from recsys.config import MAX_BUDGET_MS

STAGES = ("recall", "coarse", "final")


class WorkerRss:
    """Peak resident MiB of each Ray worker process (``ray::`` in its name) while the block runs."""

    def __init__(self, every_s: float = 0.5) -> None:
        self.every_s = every_s
        self.peaks: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for p in psutil.process_iter(["name", "memory_info"]):
                name, mem = p.info.get("name") or "", p.info.get("memory_info")
                if name.startswith("ray::") and mem is not None:
                    self.peaks[p.pid] = max(self.peaks.get(p.pid, 0.0), mem.rss / 2**20)
            self._stop.wait(self.every_s)

    def __enter__(self) -> WorkerRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, Any]:
        """The workers seen and the largest peak among them."""
        return {"workers_seen": len(self.peaks), "max_worker_peak_mib": round(max(self.peaks.values(), default=0.0), 1)}


def _same(a: Any, b: Any) -> bool:
    a, b = a.tocsr(), b.tocsr()
    a.sort_indices()
    b.sort_indices()
    return bool(a.shape == b.shape and np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)
                and np.array_equal(a.data, b.data))


def compare_channels(settings: Settings, split: Split) -> dict[str, Any]:
    """The recall stage's co-visitation and item-model weights built both ways."""
    cfg, seqs, n = recall_config(settings), split.train_sequences, split.n_items
    kw_cov: dict[str, Any] = {"window": cfg.covisit_window, "backward": cfg.covisit_backward, "top_k": cfg.neighbours}
    kw_item: dict[str, Any] = {"kind": cfg.item_model if cfg.item_model != "off" else "ease", "top_k": cfg.neighbours,
               "l2": cfg.ease_l2, "shrink": cfg.knn_shrink, "max_dense": cfg.ease_max_items}
    t0 = time.perf_counter()
    cov, (kind, item) = item_neighbours.covisitation(seqs, n, **kw_cov), item_neighbours.item_model(seqs, n, **kw_item)
    here_s = time.perf_counter() - t0
    with WorkerRss() as rss:
        t1 = time.perf_counter()
        workers = settings.ray.num_workers
        cov_r = distributed_counts.covisitation(seqs, n, min_partitions=workers, **kw_cov)
        kind_r, item_r = distributed_counts.item_model(seqs, n, partitions=workers, **kw_item)
        ray_s = time.perf_counter() - t1
    return {"item_model": kind, "in_process_s": round(here_s, 2), "ray_s": round(ray_s, 2), **rss.summary(),
            "equal": kind == kind_r and _same(cov, cov_r) and _same(item, item_r)}


def compare_coarse(settings: Settings, artifact_dir: Path, split: Split, in_process: dict[str, Any]) -> dict[str, Any]:
    """The coarse ranker trained on the cluster (into ``coarse_ray/``) beside ``in_process``, the
    report of the served ``coarse/`` that ``jobs.train`` just trained under the same settings."""
    recipe = partial(holdout_recall, settings, artifact_dir, split, settings.coarse.train_positions)
    recall, before_labels = recipe()
    with WorkerRss() as rss:
        ray_rep = train_coarse(split, recall, artifact_dir / "coarse_ray", settings.coarse, seed=settings.seed,
                               progress=False, train_stage=before_labels, cluster=settings.ray, worker_stages=recipe)
    key = f"valid_ndcg@{settings.coarse.eval_at}_coarse"
    out: dict[str, Any] = {side: {"seconds": rep["seconds"], "valid_ndcg@10": round(rep[key], 5),
                                  "best_iteration": rep["best_iteration"],
                                  "user_sample": rep.get("user_sample", {}).get("train")}
                           for side, rep in (("in_process", in_process), ("ray", ray_rep))}
    out["ray"].update(rss.summary())
    out["valid_ndcg_delta"] = round(out["ray"]["valid_ndcg@10"] - out["in_process"]["valid_ndcg@10"], 5)
    return out


def unhurried(settings: Settings) -> Settings:
    """``settings`` with every stage deadline out of reach (a loaded machine then changes no answer)."""
    stages = [s.model_copy(update={"budget_ms": MAX_BUDGET_MS}) for s in settings.pipeline.stages]
    return settings.model_copy(update={"pipeline": settings.pipeline.model_copy(
        update={"stages": stages, "request_budget_ms": MAX_BUDGET_MS})})


def compare_eval(settings: Settings, artifact_dir: Path, split: Split, users: np.ndarray) -> dict[str, Any]:
    """The per-user pass over ``users`` both ways: seconds, NDCG@10 per stage, equality of every top-10."""
    settings = unhurried(settings)
    targets = np.asarray(split.targets("test"))[users]
    t0 = time.perf_counter()
    here = run_cascade(build_pipeline(settings, artifact_dir), split, "test", progress=False,
                       requests=[requests_for_user(split, int(u), "test") for u in users])
    here_s = time.perf_counter() - t0
    with WorkerRss() as rss:
        t1 = time.perf_counter()
        there = run_cascade_on_cluster(settings, artifact_dir, split, "test", users=users, progress=False)
        ray_s = time.perf_counter() - t1
    ndcg = {side: {k: v["ndcg@10"] for k, v in slice_table(run["tops"], targets, list(STAGES), n_boot=200)["stages"].items()}
            for side, run in (("in_process", here), ("ray", there))}
    return {"users": int(len(users)), "in_process_s": round(here_s, 2), "ray_s": round(ray_s, 2),
            "ndcg10": ndcg, "equal": all(np.array_equal(here["tops"][s], there["tops"][s]) for s in STAGES),
            "worker_peak_mib": there["worker_peak_mib"], **rss.summary()}


def compare_engines(settings: Settings, artifact_dir: Path, split: Split, users: np.ndarray,
                    coarse_in_process: dict[str, Any]) -> dict[str, Any]:
    """All three comparisons inside one Ray session (``settings.ray``); ``coarse_in_process``: the
    training report of the served coarse ranker."""
    with ray_session(settings.ray):
        return {"channels": compare_channels(settings, split),
                "coarse": compare_coarse(settings, artifact_dir, split, coarse_in_process),
                "eval": compare_eval(settings, artifact_dir, split, users)}
