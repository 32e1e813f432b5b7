"""The backbone signal check: probe fit, per-request NDCG, cross-fitted fusion, and a toy run end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.llm_backbones import (
    ProbeData,
    centre,
    cross_fitted_fusion,
    fit_probe,
    per_request_ndcg,
    probe_backbone,
    random_expectation,
)
from cascade.settings import Settings
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



def _loop_ndcg(data: ProbeData, scores: np.ndarray, k: int) -> np.ndarray:
    """Reference: per request, sort its rows (score down, then stage order) and find the first held row."""
    out = np.zeros(int(data.group.max()) + 1)
    for g in np.unique(data.group):
        rows = np.flatnonzero(data.group == g)
        ranked = rows[np.lexsort((data.position[rows], -scores[rows]))][:k]
        held = rows[data.label[rows] == 1]
        if len(held) and held[0] in ranked:
            out[g] = 1.0 / np.log2(int(np.flatnonzero(ranked == held[0])[0]) + 2.0)
    return out


def _loop_random(data: ProbeData, k: int) -> np.ndarray:
    out = np.zeros(int(data.group.max()) + 1)
    for g in np.unique(data.group):
        rows = data.group == g
        if data.label[rows].any():
            n = int(rows.sum())
            out[g] = sum(1.0 / np.log2(r + 2) for r in range(min(k, n))) / n
    return out


@pytest.mark.parametrize("seed", range(4))
def test_vectorised_ndcg_equals_a_per_request_loop(seed: int) -> None:
    """Shuffled and missing groups, several or no held rows, tied and NaN scores, repeated positions."""
    rng = np.random.default_rng(seed)
    for _ in range(200):
        sizes = rng.integers(0, 12, size=int(rng.integers(1, 7)))
        sizes[0] = max(sizes[0], 1)
        group = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
        position = rng.integers(0, 5, len(group))
        label = (rng.random(len(group)) < rng.choice([0.0, 0.2, 0.7])).astype(np.int8)
        scores = np.where(rng.random(len(group)) < 0.1, np.nan, rng.integers(0, 3, len(group)) + 0.0)
        data = ProbeData(np.zeros((len(group), 1), np.float32), np.zeros(len(group)), label, group, position)
        for k in (1, 3, 10):
            assert np.array_equal(per_request_ndcg(data, scores, k), _loop_ndcg(data, scores, k))
            assert np.array_equal(random_expectation(data, k), _loop_random(data, k))


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
    scorers = {"zero_shot", "probe", "likelihood", "pmi", "popularity"}
    assert set(report["ndcg@10"]) == {"stage_order", "random", *scorers, *(f"stage+{n}" for n in scorers - {"popularity"})}
    assert all(0 <= v <= 1 for v in report["ndcg@10"].values())
    assert set(report["vs_stage_order"]) == set(report["ndcg@10"]) - {"stage_order"}
    assert set(report["vs_random"]) == scorers
    lo, hi = report["vs_random"]["probe"]["ci95"]
    assert lo <= report["vs_random"]["probe"]["mean"] <= hi
    assert set(report["spearman_vs_popularity"]) == scorers - {"popularity"}
    cost = report["cost_per_request"]
    assert cost["requests"] == 8 and cost["prompt_tokens_mean"] > 0
    assert {"p50", "p99"} <= set(cost["warm_prefix_ms"]) and {"p50", "p99"} <= set(cost["cold_prefix_ms"])
    assert report["valid_sample"] == {"users": 8, "of": 8, "seed": 0, "random": False, "held_only": False}
    sample = probe_backbone(settings, tmp_path / "toy", train_users=4, valid_users=3, candidates=5, min_history=2,
                            seed=7, progress=False)
    assert sample["valid_sample"] == {"users": 3, "of": 8, "seed": 7, "random": True, "held_only": False}
    held = probe_backbone(settings, tmp_path / "toy", train_users=4, candidates=5, min_history=2, held_only=True,
                          progress=False)
    assert held["valid_held_in_candidates"] == held["valid_users"] == held["valid_sample"]["of"]
    assert held["held_in_candidates_share"] == held["valid_users"] / 8
    with pytest.raises(ValueError, match="candidates must be >= 2"):
        probe_backbone(settings, tmp_path / "toy", candidates=1, progress=False)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_title_likelihood_matches_a_full_forward_pass(arch: str) -> None:
    """The cached-prefix pass reads each title token's log-probability where a plain forward of the
    whole prompt reads it (the slot arithmetic and the prefix continuation are right)."""
    import torch

    from bench.llm_backbones import _suffix_pass
    from llm_rerank.forward import run_prefix
    from llm_rerank.prompt import PromptBuilder
    from tests.llm_rerank.factories import tiny_llm

    model, tok = tiny_llm(arch=arch)
    parts = PromptBuilder(tok).pointwise(["Heat (1995)", "Fargo (1996)"], {}, ["Toy Story (1995)", "Alien (1979)"])
    with torch.inference_mode():
        _, got = _suffix_pass(model, run_prefix(model, parts.prefix), parts.suffixes, parts.slots, pad_id=0)
        for suffix, spans, value in zip(parts.suffixes, parts.slots, got.tolist(), strict=True):
            ids = parts.prefix + list(suffix)
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
            start, end = (len(parts.prefix) + x for x in spans[0])
            want = sum(float(logp[t - 1, ids[t]]) for t in range(start, end))
            assert end > start and value == pytest.approx(want, abs=1e-3)


def test_cli_probes_backbones_side_by_side_and_includes_earlier_reports(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from cli.main import app

    for arch in ARCHITECTURES:
        save_tiny_llm(tmp_path / arch, arch=arch)
    tiny_split().save(tmp_path / "toy" / "split")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"artifacts_dir: {tmp_path}\nllm: {{candidates: 5, precision: fp32}}\n")
    base = ["bench", "llm-probe", "--config", str(cfg), "--artifacts", str(tmp_path / "toy"), "--train-users", "6", "--min-history", "2",
            "--candidates", "5"]
    first = tmp_path / "two.json"
    res = CliRunner().invoke(app, [*base, "--model", str(tmp_path / "llama"), "--model", str(tmp_path / "qwen2"),
                                   "--out", str(first)])
    assert res.exit_code == 0, res.output
    two = json.loads(first.read_text())
    assert [r["backbone"] for r in two["table"]] == [str(tmp_path / "llama"), str(tmp_path / "qwen2")]
    assert set(two["table"][0]) >= {"stage_order", "zero_shot", "likelihood", "pmi", "probe", "stage+pmi",
                                    "cold_ms_p50_p99", "warm_ms_p50_p99", "users"}
    res = CliRunner().invoke(app, [*base, "--model", str(tmp_path / "gemma3"), "--include", str(first),
                                   "--out", str(tmp_path / "three.json")])
    assert res.exit_code == 0, res.output
    three = json.loads((tmp_path / "three.json").read_text())
    assert len(three["table"]) == 3 and three["backbones"][str(tmp_path / "llama")] == two["backbones"][
        str(tmp_path / "llama")]
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    res = CliRunner().invoke(app, [*base, "--include", str(bad)])
    assert res.exit_code == 2 and "not an llm-probe report" in res.output
