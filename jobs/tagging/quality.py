"""Tag quality against the catalog: genre micro/macro F1 on chosen items, and the held-out cut.

Ground truth is the catalog's own ``categories`` (MovieLens' 18 genre flags). Fallback records
count as predicting no genre (they are errors, not skipped). ``holdout_items`` picks the items
the adaptation job must not train on, so the F1 reported on them is not inflated by training
on the evaluation labels.

Deliberately left out: other fields (the catalog has no ground truth for themes/summary).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def genre_f1(predicted: Sequence[Sequence[str]], truth: Sequence[Sequence[str]],
             labels: Sequence[str]) -> dict[str, float]:
    """Micro and macro F1 of multi-label genre predictions (macro over labels present in truth).

    >>> r = genre_f1([["A"], ["A", "B"]], [["A"], ["B"]], ["A", "B"])
    >>> round(r["micro"], 4), round(r["macro"], 4)
    (0.8, 0.8333)
    """
    if len(predicted) != len(truth):
        raise ValueError(f"genre_f1: {len(predicted)} predictions for {len(truth)} items")
    col = {name: j for j, name in enumerate(labels)}
    pred = np.zeros((len(truth), len(labels)), dtype=bool)
    true = np.zeros_like(pred)
    for i, (p, t) in enumerate(zip(predicted, truth, strict=True)):
        pred[i, [col[g] for g in p if g in col]] = True
        true[i, [col[g] for g in t if g in col]] = True
    tp, fp, fn = (pred & true).sum(0), (pred & ~true).sum(0), (~pred & true).sum(0)
    micro = 2 * tp.sum() / max(1, 2 * tp.sum() + fp.sum() + fn.sum())
    present = true.sum(0) > 0
    per_label = 2 * tp / np.maximum(1, 2 * tp + fp + fn)
    macro = float(per_label[present].mean()) if present.any() else 0.0
    return {"micro": float(micro), "macro": macro, "items": len(truth)}


def holdout_items(n_items: int, fraction: float, seed: int) -> np.ndarray:
    """Sorted item indices held out of adaptation (a seeded random ``fraction`` of the catalog)."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"holdout fraction must be in (0, 1), got {fraction}")
    rng = np.random.default_rng(seed)
    return np.sort(rng.permutation(n_items)[: int(round(n_items * fraction))])
