"""The two-tower fit data-parallel on Ray (recall.distributed): a local 2-CPU Ray instance started and
stopped inside the test, two workers, compared with the single-process fit of the same data and seed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from recall.artifacts import MODEL_FILE, SPEC_FILE, VECTORS_FILE
from recall.distributed import shard_rows
from recall.fit import _Windows, batch_loss, setup_run
from recall.train import train_two_tower
from recsys.cluster import ClusterConfig, ray_session
from tests.recall.two_tower_factories import successor_split, tiny_config

TWO_WORKERS = ClusterConfig(address="local:2", num_workers=2)


@pytest.fixture(scope="module")
def split():
    return successor_split()


@pytest.mark.parametrize("loss", ["full", "sampled"])
def test_the_workers_shares_average_to_the_whole_batch_gradient(split, tmp_path: Path, loss: str):
    # what DDP averages over 2 workers is the gradient of the single-process batch, to float rounding
    cfg = tiny_config(loss=loss, n_negatives=16, dropout=0.0, id_dropout=0.0)
    torch.manual_seed(0)
    run = setup_run(split, tmp_path, cfg, None, None, progress=False, seed=0)
    w = _Windows.of(run.seqs, cfg.max_len)
    rows = np.arange(0, 2 * 13, 2)  # 13 windows of differing lengths: the shares are unequal
    params = list(run.item_tower.parameters()) + list(run.user_tower.parameters())

    def grads(rows_: np.ndarray, scale: float) -> list[torch.Tensor]:
        for p in params:
            p.grad = None
        x, y, attrs, prior = run.batch_inputs(w, rows_, cfg, by_length=False)
        (batch_loss(run.item_tower, run.user_tower, x, y, attrs, cfg, run.log_q, torch.Generator().manual_seed(3),
                    prior) * scale).backward()
        return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]

    whole = grads(rows, 1.0)
    shares = [shard_rows(rows, w.positions, rank, 2) for rank in range(2)]
    assert sorted(np.concatenate([mine for mine, _ in shares]).tolist()) == rows.tolist()
    averaged = [sum(g) / 2 for g in zip(*(grads(mine, share) for mine, share in shares), strict=True)]
    for a, b in zip(whole, averaged, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_two_workers_train_checkpoint_and_early_stop_like_one_process(split, tmp_path: Path):
    cfg = tiny_config(eval_every=1, patience=2)
    single = train_two_tower(split, tmp_path / "single" / "recall", cfg, progress=False, seed=7)
    with ray_session(TWO_WORKERS) as on_ray:
        assert on_ray
        dist = train_two_tower(split, tmp_path / "ray" / "recall", cfg, progress=False, seed=7, cluster=TWO_WORKERS)
    workers = dist["workers"]
    assert (workers["num_workers"], workers["cpus_per_worker"], workers["backend"]) == (2, 1, "gloo")
    assert len(workers["cpu_s"]) == 2 and min(workers["cpu_s"]) > 0 and workers["allreduce_ms"] > 0
    assert "workers" not in single
    # early stopping on valid ended both fits, each keeping its best evaluation
    assert dist["stopped_by"] == single["stopped_by"] == "early_stopping"
    assert dist["best_epoch"] < dist["epochs"] == dist["history"][-1]["epoch"]
    assert dist["valid"]["ndcg@10"] == max(h["ndcg@10"] for h in dist["history"])
    # the same steps per epoch as one process: every batch is dealt out, not every worker a batch of its own
    assert dist["steps"] / dist["epochs"] == single["steps"] / single["epochs"]
    # the successor is learnt alike: test metrics within a tolerance of the single-process fit's
    for metric in ("ndcg@10", "recall@10"):
        assert dist["test"][metric] >= 0.9
        assert abs(dist["test"][metric] - single["test"][metric]) <= 0.05, metric
    # the same artifacts, written in the same format; the workers' checkpoint folder is gone
    out = tmp_path / "ray" / "recall"
    for name in (MODEL_FILE, SPEC_FILE, VECTORS_FILE, "index/index.faiss", "report.json"):
        assert (out / name).is_file(), name
    assert set(torch.load(out / MODEL_FILE, weights_only=True)) == {"item_tower", "user_tower"}
    assert json.loads((out / "report.json").read_text())["workers"]["num_workers"] == 2
    assert not list((tmp_path / "ray").glob("two_tower_*"))
    assert np.load(out / VECTORS_FILE).shape == (split.n_items, 16)


def test_one_worker_or_no_address_stays_in_process(split, tmp_path: Path):
    # no Ray session is open here: a fit that tried to reach one would fail
    for cluster in (ClusterConfig(), ClusterConfig(address="local:2", num_workers=1)):
        assert not cluster.distributed
        report = train_two_tower(split, tmp_path / str(cluster.num_workers), tiny_config(max_epochs=2),
                                 progress=False, cluster=cluster)
        assert "workers" not in report


def test_the_wall_clock_cap_is_refused_on_a_cluster(split, tmp_path: Path):
    with pytest.raises(ValueError, match="max_train_s is not supported on a Ray cluster"):
        train_two_tower(split, tmp_path, tiny_config(max_train_s=60.0), progress=False, cluster=TWO_WORKERS)
