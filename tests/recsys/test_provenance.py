"""Result files carry their provenance: what ran, on which commit, configuration, data and machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from recsys.provenance import dataset_digest, provenance, write_result
from tests.cli.test_cli_prepare import _tiny_generic

KEYS = {"command", "commit", "config_digest", "datasets", "machine", "seeds", "date"}


def test_write_result_puts_the_provenance_block_first(tmp_path: Path) -> None:
    out = write_result(tmp_path / "r" / "x.json", {"ndcg@10": 0.125, "provenance": "overwritten"},
                       argv=["/usr/bin/recsys", "eval", "--seeds", "3"], config={"seed": 42}, seeds=[42, 43])
    text = out.read_text()
    assert text.endswith("}\n")
    body = json.loads(text)
    assert list(body) == ["provenance", "ndcg@10"] and body["ndcg@10"] == 0.125
    block = body["provenance"]
    assert set(block) == KEYS
    assert block["command"] == "recsys eval --seeds 3"  # the program's name, not its install path
    assert block["seeds"] == [42, 43] and len(block["config_digest"]) == 16
    assert block["commit"] is None or len(block["commit"].split("+")[0]) == 40
    assert block["machine"]["cores"] >= 1 and block["machine"]["cpu"]


def test_digests_follow_the_configuration_and_the_data(tmp_path: Path) -> None:
    first = provenance(argv=["x"], config={"seed": 42})["config_digest"]
    assert provenance(argv=["x"], config={"seed": 42})["config_digest"] == first
    assert provenance(argv=["x"], config={"seed": 43})["config_digest"] != first
    data = _tiny_generic(tmp_path / "shop")
    before = dataset_digest(data)
    (data / ".DS_Store").write_text("tool dropping")  # hidden files are not the dataset
    assert dataset_digest(data) == before
    (data / "interactions.csv").write_text((data / "interactions.csv").read_text() + "u0,i0,9999\n")
    assert dataset_digest(data) != before
    assert dataset_digest(tmp_path / "missing") is None and dataset_digest(None) is None


def test_an_undefined_number_is_refused_not_written_as_nan(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_result(tmp_path / "x.json", {"ndcg@10": float("nan")}, argv=["x"])
    assert not (tmp_path / "x.json").exists()


def test_a_command_with_out_records_settings_data_and_seed(tmp_path: Path) -> None:
    data = _tiny_generic(tmp_path / "shop")
    out = tmp_path / "prepare.json"
    res = CliRunner().invoke(app, ["prepare", "--data", str(data), "--artifacts", str(tmp_path / "art"),
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    body = json.loads(out.read_text())
    block = body["provenance"]
    assert set(block) == KEYS
    assert block["datasets"] == {str(data): dataset_digest(data)}
    assert block["seeds"] == [42] and len(block["config_digest"]) == 16
    assert body["dataset"] == "shop"
    printed = json.loads(res.stdout)
    assert printed == {k: v for k, v in body.items() if k != "provenance"}
