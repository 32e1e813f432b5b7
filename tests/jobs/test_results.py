"""The tables in README.md and docs/ are generated from results/ and stay in step with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.results import ROOT, ResultsError, documents, main, regenerate, render


def _results(root: Path) -> Path:
    (root / "results" / "eval").mkdir(parents=True)
    seeds = {"dataset": "toy", "seeds": [42, 43],
             "summary": {"stages.recall.ndcg@10": {"mean": 0.1, "sd": 0.01, "values": [0.09, 0.11]},
                         "stages.coarse.ndcg@10": {"mean": 0.12, "sd": 0.0, "values": [0.12, 0.12]},
                         "candidate_recall.recall@200": {"mean": 0.8, "sd": 0.02, "values": [0.78, 0.82]}},
             "per_seed": {"42": {"lists": {"users": 30}}},
             "provenance": {"commit": "0123456789abcdef", "date": "2026-12-05T10:00:00+00:00"}}
    one = {"dataset": "shop", "n_users": 1234, "stages": {"recall": {"ndcg@10": 0.25}, "final": {"ndcg@10": 0.3}},
           "runs": [{"concurrency": 1, "p50_ms": 9.356}, {"concurrency": 4, "p50_ms": 17.2}],
           "provenance": {"commit": None, "seeds": [7], "backfilled": True}}
    (root / "results" / "eval" / "seeds.json").write_text(json.dumps(seeds))
    (root / "results" / "eval" / "one.json").write_text(json.dumps(one))
    (root / "docs").mkdir()
    return root


def test_the_committed_tables_match_the_result_files() -> None:
    stale = [p.relative_to(ROOT).as_posix() for p in documents() if regenerate(p.read_text(), p) != p.read_text()]
    assert not stale, f"tables out of date, run `make results`: {stale}"
    assert main(["--check"]) == 0


def test_every_kind_renders_the_values_of_its_files(tmp_path: Path) -> None:
    root = _results(tmp_path)
    page = root / "docs" / "page.md"
    text = ("intro\n<!-- results:datasets eval/seeds.json eval/one.json -->\nstale table\n<!-- /results -->\n"
            "<!-- results:rows eval/one.json runs concurrency p50_ms -->\n<!-- /results -->\nend\n")
    out = regenerate(text, page, root)
    assert out.startswith("intro\n<!-- results:datasets eval/seeds.json eval/one.json -->\n| dataset |")
    assert "| toy | 42, 43 | 30 |  | 0.1000 ± 0.0100 | 0.1200 ± 0.0000 |  | 0.8000 ± 0.0200 |" in out
    assert "| shop | 7 | 1,234 |  | 0.2500 |  | 0.3000 |  |" in out
    assert "| 1 | 9.36 |\n| 4 | 17.2 |" in out
    assert ("Source: [`results/eval/seeds.json`](../results/eval/seeds.json) (0123456, 2026-12-05); "
            "[`results/eval/one.json`](../results/eval/one.json) (provenance backfilled).") in out
    assert "stale table" not in out and out.endswith("<!-- /results -->\nend\n")
    assert regenerate(out, page, root) == out  # a second run changes nothing


def test_compare_puts_files_side_by_side_under_their_labels(tmp_path: Path) -> None:
    root = _results(tmp_path)
    table = render('compare "before=eval/seeds.json" "after=eval/one.json"', root / "docs", "x", root)
    assert table.startswith("|  | before | after |\n|---|---|---|\n| two-tower recall NDCG@10 | 0.1000 ± 0.0100 | 0.2500 |")
    assert "| candidate recall@200 | 0.8000 ± 0.0200 |  |" in table


@pytest.mark.parametrize(("spec", "message"), [
    ("histogram eval/one.json", "page.md:2: unknown table kind 'histogram'"),
    ("stages eval/missing.json", "page.md:2: cannot read results/eval/missing.json"),
    ("fields eval/one.json stages.llm.ndcg@10", "no 'stages.llm.ndcg@10'"),
    ("stages eval/one.json eval/seeds.json", "results:stages takes one file, got 2"),
    ("datasets", "results:datasets names no result file"),
    ("rows eval/one.json runs concurrency p99_ms", "no record holds 'p99_ms'"),
])
def test_a_bad_marker_is_named_by_page_and_line(tmp_path: Path, spec: str, message: str) -> None:
    root = _results(tmp_path)
    page = root / "docs" / "page.md"
    with pytest.raises(ResultsError, match=message.replace("(", r"\(").replace(".", r"\.")):
        regenerate(f"intro\n<!-- results:{spec} -->\n<!-- /results -->\n", page, root)


def test_battery_renders_the_battery_report_one_row_per_shape(tmp_path: Path) -> None:
    root = _results(tmp_path)
    row = {"seeds": 3, "users": 600, "items": 743, "candidate_recall@200": {"mean": 0.9, "sd": 0.01},
           "stages": {"ease": {"mean": 0.19, "sd": 0.0}, "recall": {"mean": 0.23, "sd": 0.003},
                      "coarse": {"mean": 0.22, "sd": 0.002}, "final": {"mean": 0.2, "sd": 0.004}},
           "best_baseline": ["ease"] * 3, "verdict": ["beats"] * 3, "epochs": [50], "best_epochs": [34],
           "converged": True}
    report = {"seeds": 3, "shapes": {"synthetic": row, "amazon-scientific": {"skipped": "needs ../x"}},
              "provenance": {"commit": "0123456789abcdef", "date": "2026-12-06T10:00:00+00:00"}}
    (root / "results" / "eval" / "battery.json").write_text(json.dumps(report))
    table = render("battery eval/battery.json", root / "docs", "x", root)
    assert table.startswith("| shape | users × items | seeds | best baseline |")
    assert ("| synthetic | 600 × 743 | 3 | ease 0.1900 ± 0.0000 | 0.2300 ± 0.0030 | 0.2200 ± 0.0020 | "
            "0.2000 ± 0.0040 | beats | 0.9000 ± 0.0100 | 50 (34) | yes | – |") in table
    assert "| amazon-scientific | needs ../x |" in table
    assert table.endswith("Source: [`results/eval/battery.json`](../results/eval/battery.json) (0123456, 2026-12-06).\n")
    with pytest.raises(ResultsError, match="takes one file"):
        render("battery eval/battery.json eval/one.json", root / "docs", "x", root)
