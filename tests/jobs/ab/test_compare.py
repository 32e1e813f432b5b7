"""Offline A/B on the toy catalog with real (toy) stages: every key, exact LLM counts, the report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from jobs.ab.compare import PAIRED, compare_offline, per_user_beyond_accuracy
from jobs.ab.report import write_offline_report
from offline.split import Split
from recsys.config import STAGE_KINDS, StageSpec
from tests.serving.toy import TOY_KINDS, save_toy_split, toy_settings

RECALL = StageSpec(name="recall", kind="recall", on_error="fail")
LLM = StageSpec(name="llm", kind="llm")
RULES = StageSpec(name="rules", kind="rules", on_error="fail")


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Split]:
    for kind, path in TOY_KINDS.items():
        monkeypatch.setitem(STAGE_KINDS, kind, path)
    return tmp_path, save_toy_split(tmp_path)


def test_offline_ab_returns_every_key(toy: tuple[Path, Split], tmp_path: Path) -> None:
    art, split = toy
    report = compare_offline(toy_settings(RECALL, RULES), toy_settings(RECALL, LLM, RULES), art, split,
                             names=("light", "llm"), n_boot=200)
    assert set(report) == {"dataset", "protocol", "n_users", "n_items", "variants", "differences",
                           "difference_is", "latencies_ms"}
    assert report["n_users"] == 3 and report["difference_is"] == "llm - light"
    for name in ("light", "llm"):
        v = report["variants"][name]
        assert set(v["metrics"]) == {"ndcg@10", "recall@10", "mrr@10", "intra_list_diversity", "novelty", "coverage"}
        assert set(v["latency_ms"]) == {"p50", "p90", "p95", "p99", "mean", "max"}
        assert len(report["latencies_ms"][name]) == 3
    assert report["variants"]["light"]["llm"] == {"calls": 0, "prompt_tokens": 0, "tokens_per_call": 0.0}
    assert report["variants"]["llm"]["llm"]["calls"] == 3  # the toy re-ranker has no prompt: 0 tokens
    assert set(report["differences"]) == {*PAIRED, "coverage"}
    for name in PAIRED:
        d = report["differences"][name]
        assert d["diff"] == pytest.approx(d["b"] - d["a"], abs=1e-4) and len(d["ci95"]) == 2
    assert report["differences"]["coverage"]["ci95"] is None

    md = write_offline_report({k: v for k, v in report.items() if k != "latencies_ms"}, tmp_path / "rep",
                              report["latencies_ms"])
    assert "# Offline A/B: llm vs light" in md.read_text()
    for png in ("offline_differences.png", "offline_latency_cdf.png"):
        assert 0 < (tmp_path / "rep" / png).stat().st_size < 200_000


def test_beyond_accuracy_per_user_by_hand(toy: tuple[Path, Split]) -> None:
    _, split = toy
    split.items["categories"] = [["a"], ["a", "b"], ["b"], ["c"], ["a"], ["c"]]
    tops = np.array([[0, 1, -1], [0, 4, -1], [2, -1, -1]])
    out = per_user_beyond_accuracy(split, tops, "test")
    # {a} vs {a,b}: 1 - 1/2; {a} vs {a}: 0; a single item has no pair
    assert out["intra_list_diversity"][:2].tolist() == [0.5, 0.0]
    assert np.isnan(out["intra_list_diversity"][2])
    assert np.isfinite(out["novelty"]).all()
