"""The two-tower's training data: windows cut from the users' sequences, their batches, and each
target's past.

``training_windows`` cuts every train sequence into fixed-length (inputs, targets) windows;
``epoch_batches`` deals them into one epoch's batches, optionally grouping windows of similar
length so that ``trim_padding`` can drop the columns a whole batch pads (on a catalog whose users
have a handful of items, most of a ``max_len`` window is padding); ``seen_pairs`` lists, per
target, the items the user had before it, which the loss leaves out of its negatives
(``RecallConfig.mask_history``; see ``recall.fit``).
"""

from __future__ import annotations

import numpy as np
import torch

from recall.towers import BOS, PAD


def training_windows(
    sequences: list[np.ndarray], max_len: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Cut sequences into ``(inputs, targets, owner, start)`` windows of ``max_len`` from the end.

    Inputs are BOS + the sequence shifted right; targets the sequence; both left-padded
    (PAD in inputs, -1 in targets); ``owner`` is the user row of each window and ``start`` the
    sequence index of its first target (``seq[:start]`` came before the window's targets).

    >>> x, y, u, start = training_windows([np.array([7, 8, 9])], 2)
    >>> x.tolist(), y.tolist(), u.tolist(), start.tolist()
    ([[7, 8], [-1, -2]], [[8, 9], [-1, 7]], [0, 0], [1, 0])
    """
    xs, ys, owners, starts = [], [], [], []
    for u, seq in enumerate(sequences):
        seq = np.asarray(seq, dtype=np.int64)
        inputs = np.concatenate([[BOS], seq[:-1]])
        for end in range(len(seq), 0, -max_len):
            start = max(0, end - max_len)
            x = np.full(max_len, PAD, dtype=np.int64)
            y = np.full(max_len, -1, dtype=np.int64)
            x[max_len - (end - start):] = inputs[start:end]
            y[max_len - (end - start):] = seq[start:end]
            xs.append(x)
            ys.append(y)
            owners.append(u)
            starts.append(start)
    if not xs:
        raise ValueError("training_windows: every sequence is empty; nothing to train on")
    return np.stack(xs), np.stack(ys), np.asarray(owners, dtype=np.int64), np.asarray(starts, dtype=np.int64)


def window_lengths(x: np.ndarray) -> np.ndarray:
    """Real (non-padding) positions per window; windows are left-padded, so they are the last ones."""
    return (x != PAD).sum(axis=1)


def epoch_batches(lengths: np.ndarray, batch_size: int, rng: np.random.Generator, *, by_length: bool = False,
                  pool_batches: int = 50) -> list[np.ndarray]:
    """One epoch's batches of window rows, in random order.

    Plain: a random permutation cut into ``batch_size`` rows (one ``rng.permutation`` call). By
    length: that permutation is cut into pools of ``pool_batches`` batches, each pool sorted by
    window length (stable) and cut into batches, and the batches shuffled; every window is still
    seen once per epoch, but a batch's windows have similar lengths (the bucketing of sequence
    models' training loops), so ``trim_padding`` leaves little padding.

    >>> rng = np.random.default_rng(0)
    >>> bs = epoch_batches(np.array([1, 5, 1, 5]), 2, rng, by_length=True)
    >>> sorted(sorted(np.array([1, 5, 1, 5])[b].tolist()) for b in bs)
    [[1, 1], [5, 5]]
    """
    order = rng.permutation(len(lengths))
    if not by_length:
        return [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
    pool = batch_size * pool_batches
    batches = []
    for p in range(0, len(order), pool):
        rows = order[p:p + pool]
        rows = rows[np.argsort(lengths[rows], kind="stable")]
        batches += [rows[s:s + batch_size] for s in range(0, len(rows), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def trim_padding(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop the leading columns that are padding in every row of a batch.

    Exact for the user tower: positions count from the most recent item and padding is never
    attended to, so the real positions' outputs do not change.

    >>> x, y = trim_padding(np.array([[PAD, PAD, 3], [PAD, 1, 2]]), np.array([[-1, -1, 4], [-1, 2, 3]]))
    >>> x.tolist(), y.tolist()
    ([[-1, 3], [1, 2]], [[-1, 4], [2, 3]])
    """
    longest = max(int(window_lengths(x).max()), 1)
    return np.ascontiguousarray(x[:, -longest:]), np.ascontiguousarray(y[:, -longest:])


def seen_pairs(x: torch.Tensor, y: torch.Tensor, prior: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, items)``: for each target row (``y[y >= 0]`` in order) the items the user had before it.

    "Before" is the window's inputs up to the target's position and ``prior[b]`` (the items
    before window b); the target itself is never listed, so a repeat of an earlier item stays a
    class. Ids are those of ``x`` (the catalog, or a sampled loss's local ids). Pairs, not a
    ``[rows, n_items]`` mask: a window holds at most ``len(prior) + max_len`` past items.

    >>> rows, items = seen_pairs(torch.tensor([[-2, 0]]), torch.tensor([[0, 2]]), [np.zeros(0, np.int64)])
    >>> rows.tolist(), items.tolist()
    ([1], [0])
    """
    b, length = x.shape
    padded = np.full((b, max((len(p) for p in prior), default=0)), -1, dtype=np.int64)
    for i, p in enumerate(prior):
        padded[i, :len(p)] = p
    before = torch.from_numpy(padded)
    had = torch.cat([before, x], dim=1)  # [b, prior + L]: the window's past, PAD and BOS negative
    when = torch.cat([torch.full((before.shape[1],), -1), torch.arange(length)])  # prior precedes every target
    target = y >= 0
    pair = (target[:, :, None] & (had >= 0)[:, None, :] & (had[:, None, :] != y[:, :, None])
            & (when[None, None, :] <= torch.arange(length)[None, :, None]))  # [b, L, prior + L]
    w, t, j = pair.nonzero(as_tuple=True)
    row = (target.flatten().cumsum(0) - 1).view(b, length)  # target row of each (window, position)
    return row[w, t], had[w, j]


def seen_mask(x: torch.Tensor, y: torch.Tensor, prior: list[np.ndarray], n_items: int) -> torch.Tensor:
    """``[targets, n_items]`` bool: row r (the r-th ``y >= 0`` in row-major order) marks the items the
    user had before that target, the same pairs as ``seen_pairs`` as a mask over the catalog.

    For the full softmax, whose logits are ``[targets, n_items]`` anyway: a running OR over the
    window's positions is a few passes over a byte per logit, where listing the pairs compared every
    target with every past item of its window.

    >>> seen_mask(torch.tensor([[-2, 0]]), torch.tensor([[0, 2]]), [np.zeros(0, np.int64)], 3).tolist()
    [[False, False, False], [True, False, False]]
    """
    b, length = x.shape
    had = torch.zeros(b, length, n_items, dtype=torch.bool)
    lens = [len(p) for p in prior]
    if sum(lens):
        had[torch.from_numpy(np.repeat(np.arange(b), lens)), 0, torch.from_numpy(np.concatenate(prior))] = True
    w, t = (x >= 0).nonzero(as_tuple=True)
    had[w, t, x[w, t]] = True
    for pos in range(1, length):  # had[:, t] = everything up to position t
        torch.logical_or(had[:, pos - 1], had[:, pos], out=had[:, pos])
    target = y >= 0
    seen = had[target]
    seen[torch.arange(len(seen)), y[target]] = False  # a repeat of an earlier item stays a class
    return seen
