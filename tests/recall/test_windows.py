"""Training windows and each target's past (``recall.windows``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recall.windows import epoch_batches, seen_mask, seen_pairs, training_windows


def test_training_windows_cut_from_the_end_and_skip_empty_users():
    x, y, owner, start = training_windows([np.array([5, 6, 7, 8, 9]), np.array([], dtype=np.int64), np.array([3])], 3)
    assert x.tolist() == [[6, 7, 8], [-1, -2, 5], [-1, -1, -2]]
    assert y.tolist() == [[7, 8, 9], [-1, 5, 6], [-1, -1, 3]]
    assert owner.tolist() == [0, 0, 2]
    assert start.tolist() == [2, 0, 0]
    with pytest.raises(ValueError, match="every sequence is empty"):
        training_windows([np.array([], dtype=np.int64)], 3)


def test_seen_pairs_list_each_targets_past_and_never_the_target_itself():
    g = np.random.default_rng(0)
    x = torch.from_numpy(g.integers(-2, 9, (4, 6)))  # -1 PAD and -2 BOS are no items
    y = torch.from_numpy(g.integers(-1, 9, (4, 6)))
    prior = [g.integers(0, 9, n) for n in (0, 3, 1, 5)]
    rows, items = seen_pairs(x, y, prior)
    got = set(zip(rows.tolist(), items.tolist(), strict=True))
    want, row = set(), 0
    for b in range(4):
        for t in range(6):
            if y[b, t] < 0:
                continue
            past = {int(i) for i in x[b, :t + 1] if i >= 0} | {int(i) for i in prior[b]}
            want |= {(row, i) for i in past if i != int(y[b, t])}
            row += 1
    assert got == want


def test_seen_mask_marks_the_pairs_seen_pairs_lists():
    g = np.random.default_rng(1)
    x = torch.from_numpy(g.integers(-2, 9, (5, 7)))
    y = torch.from_numpy(g.integers(-1, 9, (5, 7)))
    prior = [g.integers(0, 9, n) for n in (0, 3, 1, 5, 2)]
    mask = seen_mask(x, y, prior, 9)
    assert mask.shape == (int((y >= 0).sum()), 9)
    assert set(zip(*[t.tolist() for t in mask.nonzero(as_tuple=True)], strict=True)) == set(
        zip(*[t.tolist() for t in seen_pairs(x, y, prior)], strict=True))


def test_epoch_batches_see_every_window_once_and_group_lengths_when_asked():
    lengths = np.random.default_rng(3).integers(1, 50, 1000)
    plain = epoch_batches(lengths, 32, np.random.default_rng(7))
    assert np.array_equal(np.concatenate(plain), np.random.default_rng(7).permutation(1000))  # the plain loop's order
    grouped = epoch_batches(lengths, 32, np.random.default_rng(7), by_length=True, pool_batches=10)
    assert sorted(np.concatenate(grouped).tolist()) == list(range(1000))
    assert len(grouped) == len(plain)
    spread = np.mean([np.ptp(lengths[b]) for b in grouped])
    assert spread < np.mean([np.ptp(lengths[b]) for b in plain]) / 3
