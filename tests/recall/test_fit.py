"""The two-tower's training loop (recall.fit): the loss, padding trimmed from batches, the deterministic kernels."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from recall.config import RecallConfig
from recall.fit import batch_loss, deterministic_kernels, fit, sampled_softmax, setup_run
from recall.windows import seen_pairs, training_windows, trim_padding
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


def test_the_full_softmax_loss_and_gradients_are_those_of_masking_its_logits_plainly(split, tmp_path: Path):
    # unknown items and each target's past set to -inf in a copy of the logits, the target rows taken by a
    # boolean mask: the same loss and the same gradients, bit for bit, as the loss computes them
    cfg = tiny_config(loss="full")
    run = setup_run(split, tmp_path, cfg, [s[s % 10 != 0] for s in split.train_sequences], None, progress=False,
                    seed=0)
    assert not bool(run.item_tower.known.all())
    run.item_tower.eval()
    run.user_tower.eval()
    x, y, owner, start = (torch.from_numpy(a) for a in training_windows(run.seqs, cfg.max_len))
    attrs, prior = torch.from_numpy(run.attrs[owner]), [run.seqs[o][:s] for o, s in zip(owner, start, strict=True)]
    params = [p for tower in (run.item_tower, run.user_tower) for p in tower.parameters()]
    loss = batch_loss(run.item_tower, run.user_tower, x, y, attrs, cfg, None, torch.Generator(), prior)
    items, mask = run.item_tower.all_items(), y >= 0
    logits = (run.user_tower(items, x, attrs)[mask] / cfg.temperature @ items.T).masked_fill(
        ~run.item_tower.known[None, :], float("-inf")).index_put(seen_pairs(x, y, prior), torch.tensor(float("-inf")))
    plain = F.cross_entropy(logits, y[mask])
    assert loss.item() == plain.item()
    for got, want in zip(torch.autograd.grad(loss, params, allow_unused=True),
                         torch.autograd.grad(plain, params, allow_unused=True), strict=True):
        assert (got is None and want is None) or torch.equal(got, want)


def test_the_sampled_softmax_with_every_item_once_and_a_uniform_q_is_the_full_softmax():
    gen = torch.Generator().manual_seed(0)
    h, items = torch.randn(5, 8, generator=gen), torch.randn(12, 8, generator=gen)
    y = torch.tensor([0, 3, 3, 7, 11])
    uniform = torch.full((12,), -torch.log(torch.tensor(12.0)))
    hit = torch.arange(12)[None, :] == y[:, None]  # the positive is no negative of its own row
    sampled = sampled_softmax(h, items[y], items, uniform[y], uniform, hit)
    assert float(sampled) == pytest.approx(float(F.cross_entropy(h @ items.T, y)), rel=1e-6)


def test_the_logq_correction_lowers_each_logit_by_its_log_sampling_probability():
    # every item a negative once, q skewed: the loss is the full softmax over logits - log q, so a
    # popular item (often drawn as a negative) is pushed down less than its raw logit says
    gen = torch.Generator().manual_seed(1)
    h, items = torch.randn(4, 8, generator=gen), torch.randn(6, 8, generator=gen)
    y = torch.tensor([1, 2, 5, 0])
    log_q = torch.log_softmax(torch.tensor([3.0, 0.0, -1.0, 2.0, 0.5, -2.0]), dim=0)
    hit = torch.arange(6)[None, :] == y[:, None]
    sampled = sampled_softmax(h, items[y], items, log_q[y], log_q, hit)
    assert float(sampled) == pytest.approx(float(F.cross_entropy(h @ items.T - log_q, y)), rel=1e-6)
    assert float(sampled) != pytest.approx(float(F.cross_entropy(h @ items.T, y)), rel=1e-3)


def test_a_fit_that_reaches_its_epoch_bound_is_reported_budget_stopped_and_an_early_stopped_one_converged(split, tmp_path: Path):
    reports = {}
    for name, cfg in {"bounded": tiny_config(max_epochs=2, eval_every=1, patience=5),
                      "stopped": tiny_config(max_epochs=60, eval_every=1, patience=1)}.items():
        run = setup_run(split, tmp_path / name, cfg, None, None, progress=False, seed=0)
        with deterministic_kernels():
            reports[name] = fit(run, cfg, seed=0, t0=time.perf_counter(), progress=False)
    bounded, stopped = reports["bounded"], reports["stopped"]
    assert bounded["epochs"] == 2 and bounded["stopped_by"] == "max_epochs"
    assert bounded["out_of_budget"] and not bounded["converged"]
    assert bounded["settings"]["max_epochs"] == "2 (recall.max_epochs)"
    assert stopped["stopped_by"] == "early_stopping" and stopped["converged"] and not stopped["out_of_budget"]
    assert stopped["epochs"] < 60 and stopped["epochs"] == stopped["best_epoch"] + 1


def test_the_default_epoch_bound_scales_with_the_steps_an_epoch_takes():
    config = RecallConfig()
    assert config.max_epochs is None and config.max_train_logits is None and config.max_train_s is None
    assert config.epoch_bound(19)[0] == 1053 and config.epoch_bound(1000)[0] == 200  # 20k steps, >= 200 epochs
    assert config.epoch_bound(19)[1] == "scaled: 20,000 steps / 19 steps per epoch, at least 200"


def test_length_buckets_are_on_by_default_only_where_padding_is_most_of_a_window():
    config = RecallConfig()
    assert config.uses_length_buckets(0.10)[0] and not config.uses_length_buckets(0.81)[0]  # short vs long histories
    assert config.uses_length_buckets(0.81)[1] == "auto: 81% of window positions are real, at least 50%"
    assert RecallConfig(length_buckets=False).uses_length_buckets(0.1) == (False, "recall.length_buckets")
