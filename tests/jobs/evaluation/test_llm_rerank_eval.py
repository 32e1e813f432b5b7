"""The re-ranker against coarse's order: variants parsed, ranks read, a toy run end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cascade.settings import Settings
from jobs.evaluation.llm_rerank_eval import Variant, held_rank, merge_reports, parse_variant, rerank_eval
from tests.llm_rerank.factories import save_tiny_llm, tiny_split


def test_variants_parse_with_defaults_and_refuse_bad_parts() -> None:
    assert parse_variant("m") == Variant("m", "listwise", "title_details", False)
    assert parse_variant("m/pointwise/title/adapted") == Variant("m", "pointwise", "title", True)
    assert parse_variant("org/model/pointwise") == Variant("org/model", "pointwise", "title_details", False)
    assert parse_variant("dir/m") == Variant("dir/m", "listwise", "title_details", False)  # a path, no options
    for bad, part in (("m/title", "name the scoring"), ("m/adapted", "name the scoring"), ("", "expected"),
                      ("/listwise", "expected")):
        with pytest.raises(ValueError, match=part):
            parse_variant(bad)


def test_held_rank_breaks_ties_by_incoming_order_and_marks_absence() -> None:
    items = np.array([5, 6, 7, 8])
    assert held_rank(np.array([0.0, 1.0, 1.0, 0.0]), items, 7) == 1  # tied with 6, which came first
    assert held_rank(np.zeros(4), items, 8) == 3
    assert held_rank(np.zeros(4), items, 9) == -1


def test_rerank_eval_runs_end_to_end_and_pairs_each_variant_with_coarse(tmp_path: Path) -> None:
    save_tiny_llm(tmp_path / "m")
    tiny_split().save(tmp_path / "toy" / "split")
    settings = Settings.build({"artifacts_dir": str(tmp_path), "llm": {"model": str(tmp_path / "m"),
                                                                        "candidates": 5, "precision": "fp32"}})
    variants = [Variant(str(tmp_path / "m"), "listwise", "title"), Variant(str(tmp_path / "m"), "pointwise")]
    seen: list[int] = []
    report = rerank_eval(settings, tmp_path / "toy", variants, users=6, seed=3, progress=False,
                         partial=lambda r: seen.append(len(r["variants"])))
    assert seen == [1, 2]
    assert report["candidates_from"] == "popularity" and report["sample"]["users"] == 6
    held = report["sample"]["held_in_candidates"]
    for v in report["variants"].values():
        assert v["cost_per_request"]["requests"] == held
        assert v["vs_coarse"]["users"] == 6 and v["vs_coarse_held_in"]["users"] == held
        assert 0 <= v["ndcg@10"] <= 1
        # a user whose item is outside the candidates keeps coarse's figure: the whole-sample mean is
        # the held-in mean scaled by their share
        assert v["vs_coarse"]["mean"] == pytest.approx(v["vs_coarse_held_in"]["mean"] * held / 6, abs=1e-4)
    smaller = rerank_eval(settings, tmp_path / "toy", variants[:1], users=3, seed=3, progress=False)
    assert smaller["sample"]["users"] == 3


def test_cli_writes_the_report_with_provenance_and_refuses_a_bad_variant(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from cli.main import app

    save_tiny_llm(tmp_path / "m")
    tiny_split().save(tmp_path / "toy" / "split")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"artifacts_dir: {tmp_path}\nllm: {{candidates: 5, precision: fp32}}\n")
    base = ["bench", "llm-rerank", "--config", str(cfg), "--artifacts", str(tmp_path / "toy"), "--users", "4"]
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, [*base, "--variant", f"{tmp_path / 'm'}/listwise/title", "--out", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert report["provenance"]["seeds"] == [report["sample"]["seed"]]
    assert list(report["variants"]) == [f"{tmp_path / 'm'}/listwise/title"]
    assert (tmp_path / "r.partial.json").exists()
    merged = tmp_path / "merged.json"
    res = CliRunner().invoke(app, [*base, "--include", str(out), "--variant", f"{tmp_path / 'm'}/pointwise",
                                   "--users", "2", "--out", str(merged)])
    assert res.exit_code == 0, res.output
    both = json.loads(merged.read_text())["variants"]
    assert [v["sample"]["users"] for v in both.values()] == [4, 2]  # each keeps its own sample
    assert "--include" not in next(iter(both.values()))["run_provenance"]["command"]  # the run that measured it
    res = CliRunner().invoke(app, [*base, "--variant", "m/title"])
    assert res.exit_code == 2 and "name the scoring" in res.output


def test_merge_keeps_each_run_s_sample_and_refuses_another_dataset() -> None:
    run = {"dataset": "d", "phase": "test", "candidates": 20, "sample": {"users": 9}, "coarse": {"ndcg@10": 0.1},
           "variants": {"a": {"ndcg@10": 0.2}}}
    later = {**run, "sample": {"users": 3}, "variants": {"b": {"ndcg@10": 0.3}}}
    merged = merge_reports([run, later])
    assert merged["variants"]["a"]["sample"] == {"users": 9} and merged["variants"]["b"]["sample"] == {"users": 3}
    with pytest.raises(ValueError, match="cannot merge"):
        merge_reports([run, {**later, "dataset": "other"}])
    with pytest.raises(ValueError, match="not an llm-rerank report"):
        merge_reports([run, {"variants": {}}])
