"""Threshold calibration and the bounded decision rule (jobs.tagging.calibrate)."""

from __future__ import annotations

import numpy as np
import pytest

from jobs.tagging.calibrate import calibrate, decide, default_thresholds, micro_f1
from jobs.tagging.quality import genre_f1


def test_decide_keeps_labels_above_threshold_within_the_item_bounds() -> None:
    probs = np.array([[0.9, 0.8, 0.7, 0.6],   # four pass: the three furthest above are kept
                      [0.1, 0.2, 0.3, 0.05],  # none pass: the closest one is added (min 1)
                      [0.6, 0.1, 0.55, 0.0]])
    got = decide(probs, 0.5, min_items=1, max_items=3)
    assert got.astype(int).tolist() == [[1, 1, 1, 0], [0, 0, 1, 0], [1, 0, 1, 0]]


def test_decide_compares_labels_by_log_odds_margin_over_their_own_threshold() -> None:
    # label 1 is below label 0 in probability but further above its (lower) threshold
    got = decide(np.array([[0.6, 0.3]]), np.array([0.5, 0.1]), min_items=0, max_items=1)
    assert got.astype(int).tolist() == [[0, 1]]
    assert decide(np.array([[0.2, 0.3]]), np.array([0.5, 0.5]), 0, 2).sum() == 0  # min 0: empty allowed


def test_micro_f1_matches_the_report_metric() -> None:
    rng = np.random.default_rng(0)
    pred, truth = rng.random((30, 5)) > 0.6, rng.random((30, 5)) > 0.7
    names = list("abcde")
    as_lists = [[names[j] for j in np.flatnonzero(r)] for r in pred], [[names[j] for j in np.flatnonzero(r)] for r in truth]
    assert micro_f1(pred, truth) == pytest.approx(genre_f1(*as_lists, names)["micro"])


def test_per_label_thresholds_beat_one_global_threshold_when_labels_live_on_different_scales() -> None:
    # label 0 is positive when p0 > 0.8, label 1 when p1 > 0.2: no single threshold separates both
    rng = np.random.default_rng(1)
    truth = rng.random((200, 2)) < 0.5
    probs = np.where(truth, [0.9, 0.3], [0.7, 0.1]) + rng.uniform(-0.05, 0.05, (200, 2))
    fitted = calibrate(probs, truth, min_items=0, max_items=2)
    assert fitted.rule == "per-label"
    assert fitted.calibration_f1["per-label"] == pytest.approx(1.0)
    assert fitted.calibration_f1["global"] < 0.9
    assert 0.75 < fitted.per_label[0] <= 0.85 and 0.15 < fitted.per_label[1] <= 0.25
    held = np.where(truth, [0.9, 0.3], [0.7, 0.1])  # unseen items from the same rule
    assert micro_f1(decide(held, fitted.per_label, 0, 2), truth) == 1.0


def test_a_label_with_too_few_known_positives_keeps_the_global_threshold() -> None:
    truth = np.zeros((40, 2), dtype=bool)
    truth[:20, 0] = True
    truth[0, 1] = True  # one positive: below min_positives
    probs = np.column_stack([np.r_[np.full(20, 0.9), np.full(20, 0.1)], np.linspace(0.0, 1.0, 40)])
    fitted = calibrate(probs, truth, 0, 2, min_positives=5)
    assert fitted.per_label[1] == fitted.global_threshold


@pytest.mark.parametrize(("probs", "truth", "message"), [
    (np.zeros((3, 2)), np.zeros((3, 3), dtype=bool), "same"),
    (np.zeros((3, 2)), np.zeros((3, 2), dtype=bool), "no item with a known label"),
    (np.full((2, 2), np.nan), np.ones((2, 2), dtype=bool), "NaN"),
])
def test_bad_calibration_input_is_named(probs: np.ndarray, truth: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        calibrate(probs, truth, 1, 2)


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="min_items"):
        decide(np.zeros((1, 3)), 0.5, min_items=2, max_items=1)
    with pytest.raises(ValueError, match="items, labels"):
        decide(np.zeros(3), 0.5, 0, 1)
    assert default_thresholds(3).rule == "default"
