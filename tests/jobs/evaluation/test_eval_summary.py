"""`recsys eval` prints a summary a person reads; the full report goes to --out (``jobs.evaluation.eval_summary``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from jobs.evaluation.eval_summary import summary

TINY_YAML = ("recall: {dim: 16, max_len: 10, n_blocks: 1, n_heads: 1, max_epochs: 4, eval_every: 2, use_text: false}\n"
             "coarse: {n_estimators: 20, min_child_samples: 5, early_stopping_rounds: 5, train_positions: 2}\n")
runner = CliRunner()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The tiny pipeline's eval arguments (60 synthetic users, 120 items, toy-size models)."""
    root = tmp_path_factory.mktemp("eval")
    (root / "tiny.yaml").write_text(TINY_YAML)
    return ["eval", "--config", str(root / "tiny.yaml"), "--synthetic-users", "60", "--synthetic-items", "120",
            "--no-cold-items", "--artifacts", str(root / "art")]


def _cell(stage: dict, ci: dict, metric: str) -> str:
    lo, hi = ci[metric]
    return f"{stage[metric]:.4f} [{lo:.4f}, {hi:.4f}]"


@pytest.mark.slow
def test_eval_prints_a_summary_of_the_report_it_writes_to_its_default_path(tiny: list[str]) -> None:
    res = runner.invoke(app, tiny)
    assert res.exit_code == 0, res.output
    out = Path(tiny[-1]) / "eval_test.json"
    report = json.loads(out.read_text())  # the whole report, at the default --out
    assert {"stages", "stages_ci95", "candidate_recall", "deltas", "lists", "policy_costs", "timings",
            "provenance"} <= set(report)
    lines = res.stdout.splitlines()
    assert len(lines) < 25 and not res.stdout.lstrip().startswith("{")
    assert lines[0] == f"synthetic, test phase ({report['n_users']} users, {report['n_items']} items)"
    assert lines[1] == f"users: {report['n_users']} evaluated, {report['protocol']['n_users_outside']} left out by " \
                       "the 5-core filter"
    rows = {ln.split()[0]: ln for ln in lines[3:3 + len(report["stages"])]}  # the table: one row per stage
    assert set(rows) == set(report["stages"])
    assert {"popularity", "recall", "coarse", "final"} <= set(rows)
    for name, row in rows.items():
        stage, ci = report["stages"][name], report["stages_ci95"][name]
        assert ci["ndcg@10"][0] <= stage["ndcg@10"] <= ci["ndcg@10"][1]
        assert row.split(None, 1)[1].split("    ") == [_cell(stage, ci, "ndcg@10"), _cell(stage, ci, "recall@10")]
    assert list(rows)[0] == "popularity" and list(rows)[-1] == "final"
    recall = ", ".join(f"{k} {v:.4f}" for k, v in report["candidate_recall"].items())
    assert f"candidate recall: {recall}" in lines
    lists = report["lists"]
    assert any(ln.startswith(f"lists (k=10): {lists['complete']} complete, {lists['short']} short, "
                             f"{lists['empty']} empty of {lists['users']} users") for ln in lines)
    assert lines[-3] == (f"LLM sources: coarse LLM embedding features off (no LLM item embeddings in {Path(tiny[-1])}"
                         "/tags; `recsys tag --method embed` writes them); re-ranker off; recall channel off; "
                         "tag rules off")
    assert lines[-2].startswith("warnings: ") and lines[-1] == f"full report: {out}"


@pytest.mark.slow
def test_eval_with_json_prints_the_whole_report_and_out_moves_it(tiny: list[str], tmp_path: Path) -> None:
    res = runner.invoke(app, [*tiny, "--json", "--out", str(tmp_path / "e.json")])
    assert res.exit_code == 0, res.output
    printed, written = json.loads(res.stdout), json.loads((tmp_path / "e.json").read_text())
    assert printed["stages"] == written["stages"] and "provenance" in written


def test_a_seeds_report_is_summarised_as_mean_and_sd_per_stage() -> None:
    stat = {"mean": 0.1, "sd": 0.01, "values": [0.09, 0.11]}
    report = {
        "dataset": "ml-100k", "phase": "test", "seeds": [42, 43],
        "summary": {"stages.recall.ndcg@10": stat, "stages.recall.recall@10": {"mean": 0.2, "sd": 0.02},
                    "stages.final.ndcg@10": {"mean": 0.12, "sd": 0.003}, "candidate_recall.recall@200": stat,
                    "deltas.final_vs_recall.ndcg@10.mean": {"mean": 0.02, "sd": 0.004, "beyond_sd": True}},
        "per_seed": {"42": {"lists": {"k": 10, "users": 943, "complete": 943, "short": 0, "empty": 0},
                            "warnings": ["slow"]},
                     "43": {"lists": {"k": 10, "users": 943, "complete": 942, "short": 1, "empty": 0,
                                      "short_reasons": {"no more candidates pass the rules": 1}}, "warnings": []}},
    }
    assert summary(report, Path("art/eval_test.json")).splitlines() == [
        "ml-100k, test phase, 2 seeds (42, 43): 943 users evaluated per seed",
        "        NDCG@10 mean ± sd     Recall@10 mean ± sd",
        "recall  0.1000 ± 0.0100       0.2000 ± 0.0200",
        "final   0.1200 ± 0.0030       -",
        "candidate recall: recall@200 0.1000 ± 0.0100",
        "NDCG@10 deltas (mean ± sd over seeds): final vs recall +0.0200 ± 0.0040 (beyond the sd)",
        "seed 42: lists (k=10): 943 complete, 0 short, 0 empty of 943 users",
        "seed 43: lists (k=10): 942 complete, 1 short, 0 empty of 943 users (short: no more candidates pass the rules 1)",
        "warnings: 1 (each on stderr as 'warning: ...', and in the report)",
        "full report: art/eval_test.json",
    ]


def test_a_report_without_optional_sections_still_has_a_summary() -> None:
    text = summary({"lists": {"k": 10, "users": 40, "complete": 40, "short": 0, "empty": 0}, "timings": {}},
                   Path("e.json"))
    assert text.splitlines()[-3:] == ["lists (k=10): 40 complete, 0 short, 0 empty of 40 users", "warnings: none",
                                      "full report: e.json"]


def test_the_llm_sources_line_says_what_was_on_and_why() -> None:
    sources = {"coarse_llm_embedding_features": {"coarse": {"chosen": True, "why": "it lifts"}},
               "llm_rerank": {"on": True, "why": "enabled"}, "llm_recall_channel": {"on": False, "why": "-"},
               "llm_tag_rules": {"on": False, "why": "-"}}
    lines = summary({"llm_sources": sources}, Path("e.json")).splitlines()
    assert lines[-3] == ("LLM sources: coarse LLM embedding features on (it lifts); re-ranker on; recall channel off; "
                         "tag rules off")
