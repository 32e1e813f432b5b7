"""The two-tower's training data: windows cut from the users' sequences, and each target's past.

``training_windows`` cuts every train sequence into fixed-length (inputs, targets) windows;
``seen_pairs`` lists, per target, the items the user had before it, which the loss leaves out
of its negatives (``RecallConfig.mask_history``; see ``recall.train``).
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
