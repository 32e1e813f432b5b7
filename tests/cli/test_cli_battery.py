"""Bad input to `recsys battery` and `recsys bench reliability`: one error line, exit 2, nothing run."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()


@pytest.mark.parametrize(("args", "message"), [
    (["--shapes", ""], "error: --shapes names no shape; known: ml100k,"),
    (["--shapes", "ml100k,nosuch"], "error: unknown shape(s) 'nosuch'; known: ml100k,"),
    (["--shapes", "synthetic", "--config", "/nonexistent.yaml"], "error: /nonexistent.yaml: config file not found"),
])
def test_battery_refuses_bad_input_before_any_shape_runs(tmp_path: Path, args: list[str], message: str) -> None:
    res = runner.invoke(app, ["battery", "--work", str(tmp_path / "work"), *args])
    assert res.exit_code == 2 and res.stderr.strip().startswith(message), res.output
    assert not (tmp_path / "work").exists()


def test_bench_reliability_refuses_untrained_artifacts_and_an_endless_flood(tmp_path: Path) -> None:
    (tmp_path / "art" / "split").mkdir(parents=True)
    res = runner.invoke(app, ["bench", "reliability", "--artifacts", str(tmp_path / "art")])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.output
    assert "the pipeline does not load" in res.stderr
    res = runner.invoke(app, ["bench", "reliability", "--artifacts", str(tmp_path / "art"), "--flood-seconds", "inf"])
    assert res.exit_code == 2 and "--flood-seconds" in res.stderr
