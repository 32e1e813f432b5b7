"""The two-tower fit, data-parallel on a Ray cluster (Ray Train's ``TorchTrainer``, PyTorch DDP).

``fit_distributed`` is ``recall.fit.fit`` run on ``num_workers`` Ray Train workers: the same model
(the driver's freshly initialised towers, which DDP broadcasts from rank 0), the same epoch loop,
batches, early stopping and report; ``recall.train`` calls it in place of ``fit`` when the cluster
setting (``recsys.cluster.ClusterConfig``) has an address and more than one worker.

How the work is split: every worker draws the same epoch batches from the same seed
(``recall.windows.epoch_batches``), and each step's batch is dealt to the workers (rank r takes
rows r, r + N, ...; a batch shorter than N is computed whole by every worker). Each worker's loss is
its rows' mean scaled by its share of the batch's target positions, so the gradient DDP averages
is the single-process batch's gradient: the same number of optimizer steps per epoch, each over
the same windows, with 1/N of the forward and backward per worker. A sampled loss draws its shared
negatives from the same generator state on every worker. Dropout masks differ per worker (seed + rank).

Early stopping: rank 0 evaluates the valid users and broadcasts the metrics, so every worker keeps
the same best weights and stops at the same epoch. Rank 0 writes the best weights as a Ray Train
checkpoint in ``model.pt``'s format (``recall.artifacts.MODEL_FILE``) under ``storage``, which must
be a path every worker and the driver can read (on a multi-node cluster, a shared filesystem: the
artifacts directory lives there; docs/cluster.md); the driver loads it into its towers, removes
the checkpoint folder and saves the artifacts as a single-process fit does.

Deliberately left out: GPUs (the loss builds its tensors on the CPU; ``TorchConfig`` would take
``nccl`` once it places them on the device), the wall-clock cap ``max_train_s`` (workers would
reach it at different steps and wait on each other forever: refused), resuming from a checkpoint.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from recall.artifacts import MODEL_FILE, REPORT_FILE
from recall.config import RecallConfig
from recall.fit import Run, _Windows, batch_loss, deterministic_kernels, fit
from recsys.cluster import ClusterConfig


class _TowersLoss(nn.Module):
    """Both towers as one module whose forward is ``batch_loss``: what DDP wraps, so every step's
    gradients are averaged across workers by the module's own backward hooks."""

    def __init__(self, run: Run, config: RecallConfig) -> None:
        super().__init__()
        self.item_tower, self.user_tower = run.item_tower, run.user_tower
        self.config, self.log_q = config, run.log_q

    def forward(self, x: torch.Tensor, y: torch.Tensor, attrs: torch.Tensor, gen: torch.Generator,
                prior: list[np.ndarray]) -> torch.Tensor:
        return batch_loss(self.item_tower, self.user_tower, x, y, attrs, self.config, self.log_q, gen, prior)


@dataclass
class _RankRun(Run):
    """One worker's view of a ``Run``: its share of every batch through DDP, rank 0's evaluation."""

    rank: int
    world: int
    ddp: nn.Module  # _TowersLoss in DDP (ray.train.torch.prepare_model)

    def rows_loss(self, w: _Windows, rows: np.ndarray, config: RecallConfig, gen: torch.Generator,
                  by_length: bool) -> torch.Tensor:
        mine, share = shard_rows(rows, w.positions, self.rank, self.world)
        x, y, attrs, prior = self.batch_inputs(w, mine, config, by_length)
        return self.ddp(x, y, attrs, gen, prior) * share

    def evaluate(self, histories: list[np.ndarray], targets: np.ndarray) -> dict[str, float]:
        out = [super().evaluate(histories, targets) if self.rank == 0 else None]
        dist.broadcast_object_list(out, src=0)  # one decision for all: the same best epoch, the same stop
        return out[0]  # type: ignore[return-value]


def shard_rows(rows: np.ndarray, positions: np.ndarray, rank: int, world: int) -> tuple[np.ndarray, float]:
    """(rank's rows of one batch, the factor on their mean loss); the factors make DDP's average of the
    workers' gradients the gradient of the whole batch's mean over its target positions.

    >>> rows, share = shard_rows(np.arange(5), np.array([1, 1, 1, 1, 4]), rank=0, world=2)
    >>> rows.tolist(), share
    ([0, 2, 4], 1.5)
    >>> shard_rows(np.arange(1), np.array([3]), rank=1, world=2)[0].tolist()  # too short to deal: whole
    [0]
    """
    if len(rows) < world:
        return rows, 1.0
    mine = rows[rank::world]
    return mine, world * float(positions[mine].sum()) / max(float(positions[rows].sum()), 1.0)


def fit_distributed(run: Run, config: RecallConfig, seed: int, progress: bool, cluster: ClusterConfig,
                    storage: Path, epochs: int | None = None, max_logits: float | None = None) -> dict[str, Any]:
    """``recall.fit.fit`` on ``cluster.num_workers`` Ray Train workers; leaves the best (or, for a refit,
    the last) weights in ``run``'s towers and returns the fit's report plus ``workers``: their number, CPUs
    and backend, each worker's CPU seconds (``cpu_s``) and one gradient all-reduce's milliseconds
    (``allreduce_ms``, what each step spends on communication).

    Needs a Ray session (``recsys.cluster.ray_session``); ``storage`` (absolute, readable by every
    worker) holds the checkpoint while the fit runs and is removed after."""
    if config.max_train_s is not None:
        raise ValueError("recall.max_train_s is not supported on a Ray cluster (workers would stop at different "
                         "steps); bound the fit with recall.max_train_logits or recall.max_epochs")
    from ray.train import RunConfig, ScalingConfig  # lazy: heavy optional dependency, only on a cluster
    from ray.train.torch import TorchConfig, TorchTrainer  # lazy: Ray Train loads only on a cluster

    storage = Path(storage).resolve()
    name = f"two_tower_{int(time.time() * 1000)}"
    trainer = TorchTrainer(
        _worker,
        train_loop_config={"run": run, "config": config, "seed": seed, "progress": progress, "epochs": epochs,
                           "max_logits": max_logits, "threads": cluster.cpus_per_worker},
        scaling_config=ScalingConfig(num_workers=cluster.num_workers, use_gpu=False,
                                     resources_per_worker={"CPU": cluster.cpus_per_worker}),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(name=name, storage_path=str(storage)),
    )
    result = trainer.fit()
    if result.checkpoint is None:
        raise RuntimeError("the distributed two-tower fit ended without a checkpoint")
    try:
        with result.checkpoint.as_directory() as ckpt:
            state = torch.load(Path(ckpt) / MODEL_FILE, weights_only=True)
            report: dict[str, Any] = json.loads((Path(ckpt) / REPORT_FILE).read_text())
    finally:
        shutil.rmtree(storage / name, ignore_errors=True)
    run.item_tower.load_state_dict(state["item_tower"])
    run.user_tower.load_state_dict(state["user_tower"])
    report["workers"] = {"num_workers": cluster.num_workers, "cpus_per_worker": cluster.cpus_per_worker,
                         "backend": "gloo", **report.pop("worker_costs")}
    return report


def _worker(loop: dict[str, Any]) -> None:
    """One Ray Train worker: the fit over its share of each batch; rank 0 reports the checkpoint."""
    import ray.train  # lazy: only inside a Ray Train worker
    from ray.train import Checkpoint  # lazy: Ray Train loads only on a cluster
    from ray.train.torch import prepare_model  # lazy: Ray Train loads only on a cluster

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(loop["threads"])
    torch.manual_seed(loop["seed"] + rank)  # dropout: each worker its own masks
    base: Run = loop["run"]
    config: RecallConfig = loop["config"]
    # DDP broadcasts rank 0's weights on wrapping; the buffers (item features, the known mask) never change
    ddp = prepare_model(_TowersLoss(base, config), parallel_strategy_kwargs={"broadcast_buffers": False})
    run = _RankRun(**{f.name: getattr(base, f.name) for f in fields(Run)}, rank=rank, world=world, ddp=ddp)
    with deterministic_kernels():
        report = fit(run, config, loop["seed"], time.perf_counter(), loop["progress"] and rank == 0,
                     epochs=loop["epochs"], max_logits=loop["max_logits"])
    cpu_s: list[float | None] = [None] * world
    dist.all_gather_object(cpu_s, round(time.process_time(), 1))
    report["worker_costs"] = {"cpu_s": cpu_s, "allreduce_ms": _allreduce_ms(ddp)}
    if rank != 0:
        ray.train.report({"epochs": report["epochs"]}, checkpoint=None)
        return
    with tempfile.TemporaryDirectory() as tmp:
        torch.save({"item_tower": run.item_tower.state_dict(), "user_tower": run.user_tower.state_dict()},
                   Path(tmp) / MODEL_FILE)
        (Path(tmp) / REPORT_FILE).write_text(json.dumps(report))
        ray.train.report({"epochs": report["epochs"]}, checkpoint=Checkpoint.from_directory(tmp))


def _allreduce_ms(model: nn.Module, repeats: int = 20) -> float:
    """Median milliseconds of one all-reduce of a gradient-sized buffer (every parameter's element count,
    float32) across the workers: the communication each optimizer step adds over a single process."""
    buffer = torch.zeros(sum(p.numel() for p in model.parameters()), dtype=torch.float32)
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(buffer)
        times.append((time.perf_counter() - t0) * 1000)
    return round(float(np.median(times)), 3)
