"""The backbone signal check: probe fit, per-request NDCG, cross-fitted fusion, and a toy run end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llm_rerank.probe import (
    ProbeData,
    centre,
    cross_fitted_fusion,
    fit_probe,
    per_request_ndcg,
    probe_backbone,
    random_expectation,
)
from recsys.settings import Settings
from tests.llm_rerank.factories import ARCHITECTURES, save_tiny_llm, tiny_split


def _planted(groups: int, rows: int = 10, seed: int = 0, signal: float = 2.0) -> ProbeData:
    """Random 16-d states; the held item (at a random stage position) has +signal on dimension 3."""
    rng = np.random.default_rng(seed)
    label = np.zeros((groups, rows), dtype=np.int8)
    label[np.arange(groups), rng.integers(0, rows, groups)] = 1
    states = rng.normal(size=(groups * rows, 16)).astype(np.float32)
    states[:, 3] += signal * label.ravel()
    return ProbeData(states, rng.normal(size=groups * rows), label.ravel(),
                     np.repeat(np.arange(groups), rows), np.tile(np.arange(rows), groups))


def test_probe_learns_a_planted_direction_on_unseen_requests() -> None:
    probe = fit_probe(_planted(200, seed=0))
    test = _planted(100, seed=1)
    oracle = per_request_ndcg(test, test.states[:, 3].astype(np.float64)).mean()  # the planted dimension itself
    assert per_request_ndcg(test, probe(test)).mean() > 0.95 * oracle > 0.75
    assert per_request_ndcg(test, test.zero_shot).mean() < 0.6  # noise scores do not
    with pytest.raises(ValueError, match="both held and other items"):
        fit_probe(ProbeData(test.states, test.zero_shot, np.zeros_like(test.label), test.group, test.position))


def test_ndcg_ties_fall_back_to_stage_order_and_random_expectation() -> None:
    data = ProbeData(np.zeros((5, 2), np.float32), np.zeros(5), np.array([0, 0, 1, 0, 0], np.int8),
                     np.array([0, 0, 0, 1, 1]), np.array([0, 1, 2, 0, 1]))
    flat = np.zeros(5)
    np.testing.assert_allclose(per_request_ndcg(data, flat), [1 / np.log2(4), 0.0])  # rank 2; group 1: no held item
    np.testing.assert_allclose(per_request_ndcg(data, np.array([0, 0, 9, 0, 0.0])), [1.0, 0.0])
    np.testing.assert_allclose(random_expectation(data), [sum(1 / np.log2(r + 2) for r in range(3)) / 3, 0.0])
    np.testing.assert_allclose(centre(np.array([[1.0], [3.0], [5.0]]), np.array([0, 0, 1])), [[-1.0], [1.0], [0.0]])


def test_fusion_weight_is_chosen_on_the_other_half() -> None:
    data = _planted(60, seed=2)
    truth = data.label.astype(np.float64)
    stage = per_request_ndcg(data, -data.position.astype(np.float64))
    good, weights = cross_fitted_fusion(data, truth, seed=0)
    assert min(weights) > 0 and good.mean() > stage.mean()
    bad, weights = cross_fitted_fusion(data, -truth, seed=0)  # an anti-signal: the weight stays 0
    assert weights == [0.0, 0.0]
    np.testing.assert_allclose(bad, stage)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_probe_backbone_runs_end_to_end_on_a_toy_model(tmp_path: Path, arch: str) -> None:
    save_tiny_llm(tmp_path / "m", arch=arch)
    tiny_split().save(tmp_path / "toy" / "split")
    settings = Settings.build({"artifacts_dir": str(tmp_path), "llm": {"model": str(tmp_path / "m"),
                                                                        "candidates": 5, "precision": "fp32"}})
    report = probe_backbone(settings, tmp_path / "toy", train_users=8, candidates=5, min_history=2, progress=False)
    assert report["candidates_from"] == "popularity" and report["valid_users"] == 8
    assert 0 < report["train_requests"] <= 8
    assert set(report["ndcg@10"]) == {"stage_order", "zero_shot", "probe", "random", "stage+probe", "stage+zero_shot"}
    assert all(0 <= v <= 1 for v in report["ndcg@10"].values())
    assert set(report["vs_stage_order"]) == {"zero_shot", "probe", "random", "stage+probe", "stage+zero_shot"}
    lo, hi = report["probe_vs_random"]["ci95"]
    assert lo <= report["probe_vs_random"]["mean"] <= hi
    cost = report["cost_per_request"]
    assert cost["requests"] == 8 and cost["prompt_tokens_mean"] > 0
    assert 0 < cost["warm_prefix_ms"]["p50"] < cost["cold_prefix_ms"]["p50"]  # a warm prefix skips its pass
    assert report["valid_sample"] == {"users": 8, "of": 8, "seed": 0, "random": False}
    sample = probe_backbone(settings, tmp_path / "toy", train_users=4, valid_users=3, candidates=5, min_history=2,
                            seed=7, progress=False)
    assert sample["valid_sample"] == {"users": 3, "of": 8, "seed": 7, "random": True}
    with pytest.raises(ValueError, match="candidates must be >= 2"):
        probe_backbone(settings, tmp_path / "toy", candidates=1, progress=False)
