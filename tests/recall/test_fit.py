"""The two-tower's training loop (recall.fit): the loss and the deterministic kernels."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from recall.fit import batch_loss, deterministic_kernels, setup_run
from recall.windows import training_windows
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
