"""``recsys tag`` options given before a subcommand's name apply to it (they were silently dropped)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from jobs.prepare import prepare

runner = CliRunner()


@pytest.fixture
def prepared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A split in its own folder, run from an empty directory (no ./artifacts to fall back on)."""
    art = tmp_path / "shop"
    prepare(None, art, n_users=30, n_items=40, seed=1)
    monkeypatch.chdir(tmp_path)
    return art


@pytest.mark.parametrize("command", ["merge-items", "embed-train", "ablation"])
def test_artifacts_before_the_subcommand_are_the_ones_it_reads(prepared: Path, command: str) -> None:
    res = runner.invoke(app, ["tag", "--artifacts", str(prepared), command])
    assert res.exit_code != 0
    assert str(prepared) in res.output and "artifacts/synthetic" not in res.output, res.output


@pytest.mark.parametrize("command", ["merge-items", "embed-train", "ablation"])
def test_a_folder_without_a_split_named_before_the_subcommand_is_refused_by_name(tmp_path: Path, command: str,
                                                                                  monkeypatch: pytest.MonkeyPatch
                                                                                  ) -> None:
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["tag", "--artifacts", str(tmp_path / "elsewhere"), command])
    assert res.exit_code == 2 and str(tmp_path / "elsewhere" / "split") in res.output, res.output


def test_the_same_option_given_twice_with_two_values_is_refused(prepared: Path, tmp_path: Path) -> None:
    res = runner.invoke(app, ["tag", "--artifacts", str(prepared), "merge-items", "--artifacts", str(tmp_path / "b")])
    assert res.exit_code == 2 and "given twice" in res.output


def test_a_tagging_option_before_a_subcommand_is_refused(prepared: Path) -> None:
    res = runner.invoke(app, ["tag", "--engine", "ray", "--artifacts", str(prepared), "merge-items"])
    assert res.exit_code == 2 and "--engine" in res.output and "merge-items" in res.output
