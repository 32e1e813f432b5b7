"""bench.coarse_variants: two coarse settings on one recall fit, paired per seed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench.coarse_variants import compare, main, overrides
from tests.trained_cascade import TINY_CONFIG


def test_overrides_nest_and_parse_values() -> None:
    assert overrides(["coarse.item_age_features=false", "coarse.num_leaves=7"]) == {
        "coarse": {"item_age_features": False, "num_leaves": 7}}
    with pytest.raises(ValueError, match="expected section.key=value"):
        overrides(["coarse.item_age_features"])


def test_both_variants_train_beside_one_recall_fit(tiny_cascade, tmp_path: Path) -> None:
    art = tmp_path / "art"
    shutil.copytree(tiny_cascade[0], art, symlinks=True)
    report = compare(art, [42], {"coarse": {"item_age_features": False}}, TINY_CONFIG)
    row = report["per_seed"]["42"]
    assert row["base"]["recall"] == row["set"]["recall"]  # the same recall fit under both
    lo, hi = row["delta_coarse"]["ci95"]
    assert lo <= row["delta_coarse"]["mean"] <= hi
    names = {name: json.loads((art / "variants" / f"{name}-42" / "coarse" / "meta.json").read_text())["feature_names"]
             for name in ("base", "set")}
    assert "item_age" in names["base"] and "item_age" not in names["set"]
    assert (art / "variants" / "base-42" / "recall").is_symlink()
    assert report["summary"]["delta_coarse"]["mean"] == row["delta_coarse"]["mean"]


def test_a_directory_without_a_recall_fit_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--artifacts", str(tmp_path), "--set", "coarse.item_age_features=false", "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "no split, recall, recall_holdout" in err[0]
