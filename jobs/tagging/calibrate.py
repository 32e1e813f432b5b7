"""Decision thresholds for per-label probabilities, fitted where the labels are known.

``decide`` turns probabilities [items, labels] into label sets a schema admits: the labels at
or above their threshold, then, when fewer than ``min_items`` pass, the ones closest to passing
are added, and when more than ``max_items`` pass, only the ``max_items`` furthest above are
kept. "Closest"/"furthest" is the log-odds margin logit(p) - logit(threshold), so labels with
different thresholds compare on one scale.

``calibrate`` fits thresholds on the items whose labels the catalog knows (the items not held
out of evaluation), maximising micro F1 of the decided sets, schema bounds included:

- *global*: one threshold for every label (a grid over the probabilities' quantiles);
- *per-label*: starting from the global one, coordinate ascent over each label's threshold
  (two sweeps), each step keeping the change only if micro F1 on the calibration items rises.
  A label with fewer than ``min_positives`` known positives keeps the global threshold.

The per-label result is used when it beats global on the calibration items (it starts there,
so it never does worse there); both are returned so a report can show what each does held out.

Deliberately left out: scoring (``jobs.tagging.logits``), the F1 definition shared with the
generation path (``jobs.tagging.quality``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

EPS = 1e-6


@dataclass(frozen=True)
class Thresholds:
    """Fitted thresholds per label and what they scored on the calibration items."""

    per_label: np.ndarray  # [labels] the thresholds in use
    rule: str  # "per-label" | "global" | "default"
    global_threshold: float
    calibration_f1: dict[str, float] = field(default_factory=dict)  # micro F1 by rule
    items: int = 0

    def as_dict(self, labels: list[str]) -> dict[str, object]:
        return {"rule": self.rule, "global": self.global_threshold, "items": self.items,
                "calibration_micro_f1": self.calibration_f1,
                "per_label": {name: float(t) for name, t in zip(labels, self.per_label, strict=True)}}


def log_odds(p: np.ndarray) -> np.ndarray:
    """logit(p), clipped away from 0 and 1."""
    p = np.clip(p, EPS, 1 - EPS)
    return np.log(p) - np.log1p(-p)


def decide(probs: np.ndarray, thresholds: np.ndarray | float, min_items: int, max_items: int) -> np.ndarray:
    """Boolean label sets [items, labels] within ``[min_items, max_items]`` per item.

    >>> decide(np.array([[0.9, 0.2, 0.6], [0.1, 0.3, 0.2]]), 0.5, 1, 1).astype(int).tolist()
    [[1, 0, 0], [0, 1, 0]]
    """
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2:
        raise ValueError(f"decide: probabilities must be [items, labels], got shape {probs.shape}")
    if not 0 <= min_items <= max_items or max_items < 1:
        raise ValueError(f"decide: need 0 <= min_items <= max_items and max_items >= 1, got {min_items}, {max_items}")
    thr = np.broadcast_to(np.asarray(thresholds, dtype=np.float64), probs.shape[1:])
    margin = log_odds(probs) - log_odds(thr)
    chosen = margin >= 0
    rank = np.argsort(np.argsort(-margin, axis=1, kind="stable"), axis=1)  # 0 = largest margin
    chosen &= rank < max_items
    chosen |= rank < min(min_items, probs.shape[1])
    return chosen


def micro_f1(pred: np.ndarray, truth: np.ndarray) -> float:
    """Micro F1 of boolean [items, labels] predictions (the same formula as ``quality.genre_f1``)."""
    tp = int((pred & truth).sum())
    wrong = int((pred ^ truth).sum())
    return 2 * tp / max(1, 2 * tp + wrong)


def _grid(values: np.ndarray, n: int = 64) -> np.ndarray:
    return np.unique(np.quantile(values, np.linspace(0.0, 1.0, n)))


def calibrate(probs: np.ndarray, truth: np.ndarray, min_items: int, max_items: int, *,
              min_positives: int = 5, sweeps: int = 2) -> Thresholds:
    """Thresholds maximising micro F1 of ``decide`` on items with known labels ``truth`` (bool)."""
    probs, truth = np.asarray(probs, dtype=np.float64), np.asarray(truth, dtype=bool)
    if probs.shape != truth.shape or probs.ndim != 2:
        raise ValueError(f"calibrate: probabilities {probs.shape} and labels {truth.shape} must be the same [items, labels]")
    if len(probs) == 0 or not truth.any():
        raise ValueError("calibrate: no item with a known label to calibrate on")
    if not np.isfinite(probs).all():
        raise ValueError("calibrate: probabilities contain NaN or inf")

    def score(thr: np.ndarray) -> float:
        return micro_f1(decide(probs, thr, min_items, max_items), truth)

    n_labels = probs.shape[1]
    best_global, best_f1 = 0.5, -1.0
    for t in _grid(probs.ravel(), 128):
        f1 = score(np.full(n_labels, t))
        if f1 > best_f1:
            best_global, best_f1 = float(t), f1
    per_label = np.full(n_labels, best_global)
    current = best_f1
    tunable = [j for j in range(n_labels) if truth[:, j].sum() >= min_positives]
    for _ in range(sweeps):
        for j in tunable:
            for t in _grid(probs[:, j]):
                trial = per_label.copy()
                trial[j] = t
                f1 = score(trial)
                if f1 > current + 1e-12:
                    per_label, current = trial, f1
    rule = "per-label" if current > best_f1 else "global"
    return Thresholds(per_label=per_label if rule == "per-label" else np.full(n_labels, best_global), rule=rule,
                      global_threshold=best_global, calibration_f1={"global": best_f1, "per-label": current},
                      items=len(probs))


def default_thresholds(n_labels: int, threshold: float = 0.5) -> Thresholds:
    """For a closed field the catalog has no labels for (audience, risk flags, themes): P(Yes) >= 0.5."""
    return Thresholds(per_label=np.full(n_labels, threshold), rule="default", global_threshold=threshold)
