"""The two-tower's training loop (recall.fit): the loss, padding trimmed from batches, the deterministic kernels."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from recall.fit import batch_loss, deterministic_kernels, fit, setup_run
from recall.windows import training_windows, trim_padding
from tests.recall.two_tower_factories import successor_split, tiny_config


@pytest.fixture(scope="module")
def split():
    return successor_split()


def test_deterministic_kernels_are_scoped_to_the_fit():
    assert not torch.are_deterministic_algorithms_enabled()
    with deterministic_kernels():
        assert torch.are_deterministic_algorithms_enabled()
    assert not torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with deterministic_kernels():
            pass
        assert torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("loss", ["full", "sampled"])
def test_masking_the_history_takes_its_items_out_of_the_negatives(split, tmp_path: Path, loss: str):
    # dropping negatives can only lower a softmax loss; here every window has a past, so strictly
    cfg = tiny_config(loss=loss, n_negatives=64)
    run = setup_run(split, tmp_path, cfg, None, None, progress=False, seed=0)
    x, y, owner, start = training_windows(run.seqs, cfg.max_len)
    prior = [run.seqs[o][:s] for o, s in zip(owner, start, strict=True)]
    args = (run.item_tower, run.user_tower, torch.from_numpy(x), torch.from_numpy(y),
            torch.from_numpy(run.attrs[owner]))
    with torch.no_grad():
        on = batch_loss(*args, cfg, run.log_q, torch.Generator().manual_seed(1), prior)
        off = batch_loss(*args, cfg.model_copy(update={"mask_history": False}), run.log_q,
                         torch.Generator().manual_seed(1), [])
    assert float(on) < float(off)


@pytest.mark.parametrize("loss", ["full", "sampled"])
def test_trimming_a_batchs_padding_leaves_the_loss_unchanged(split, tmp_path: Path, loss: str):
    # windows of different real lengths: the trimmed batch keeps the longest, so nothing real is cut
    cfg = tiny_config(loss=loss, n_negatives=64, max_len=20)
    run = setup_run(split, tmp_path, cfg, [s[: 3 + u % 5] for u, s in enumerate(split.train_sequences)], None,
                    progress=False, seed=0)
    x, y, owner, start = training_windows(run.seqs, cfg.max_len)
    xt, yt = trim_padding(x, y)
    assert xt.shape[1] < x.shape[1]
    prior = [run.seqs[o][:s] for o, s in zip(owner, start, strict=True)]
    run.item_tower.eval()
    run.user_tower.eval()
    with torch.no_grad():
        full, trimmed = (batch_loss(run.item_tower, run.user_tower, torch.from_numpy(a), torch.from_numpy(b),
                                    torch.from_numpy(run.attrs[owner]), cfg, run.log_q,
                                    torch.Generator().manual_seed(1), prior) for a, b in ((x, y), (xt, yt)))
    assert float(trimmed) == pytest.approx(float(full), rel=1e-5)


def test_length_buckets_train_to_the_same_quality(split, tmp_path: Path):
    # the successor task is learnt either way; bucketing changes the batches, not what is learnt
    results = {}
    for buckets in (False, True):
        cfg = tiny_config(length_buckets=buckets, max_epochs=6, eval_every=2)
        run = setup_run(split, tmp_path / str(buckets), cfg, None, None, progress=False, seed=0)
        with deterministic_kernels():
            results[buckets] = fit(run, cfg, seed=0, t0=time.perf_counter(), progress=False)
    assert results[True]["steps"] == results[False]["steps"]
    assert results[True]["valid"]["ndcg@10"] > 0.5 and results[False]["valid"]["ndcg@10"] > 0.5
