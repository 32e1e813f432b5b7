"""``recsys ab offline`` from the shell on the toy catalog: serving's artifact checks, warnings, ``--artifacts-b``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner, Result

from cascade.registry import STAGE_KINDS, config_id
from cascade.settings import Settings
from cli.main import app
from offline.split import split_id
from tests.serving.toy import TOY_KINDS, save_toy_split

runner = CliRunner()
STAGES = [{"name": "recall", "kind": "recall", "on_error": "fail"}, {"name": "rules", "kind": "rules", "on_error": "fail"}]


def pipeline_yaml(path: Path, depth: int | None = None) -> Path:
    stages = [{**STAGES[0], **({"depth": depth} if depth else {})}, STAGES[1]]
    path.write_text(yaml.safe_dump({"pipeline": {"max_k": 5, "stages": stages}}))
    return path


def record_training(art: Path, config: Path, on_split: str | None = None) -> None:
    """The ``recall/stage.json`` training writes: the split and the config the stage was trained on."""
    (art / "recall").mkdir(exist_ok=True)
    (art / "recall" / "stage.json").write_text(json.dumps(
        {"split_id": on_split or split_id(art), "config_id": config_id(Settings.from_yaml(config), "recall")}))


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for kind, path in TOY_KINDS.items():
        monkeypatch.setitem(STAGE_KINDS, kind, path)
    art = tmp_path / "art"
    save_toy_split(art)
    return art


def offline(art: Path, a: Path, b: Path, *extra: str) -> Result:
    return runner.invoke(app, ["ab", "offline", "--a", str(a), "--b", str(b), "--artifacts", str(art),
                               "--n-boot", "100", *extra])


def test_offline_refuses_stages_trained_on_another_split(toy: Path, tmp_path: Path) -> None:
    # after `prepare` rebuilt the split, `recommend` and `serve` refused; `ab offline` measured, exit 0
    a = pipeline_yaml(tmp_path / "a.yaml")
    record_training(toy, a, on_split="0123456789abcdef")
    out = tmp_path / "ab.json"
    res = offline(toy, a, a, "--out", str(out))
    assert res.exit_code == 2, res.output
    [line] = res.stderr.strip().splitlines()
    assert line.startswith(f"error: {toy}: stage(s) ['recall'] were trained on another split"), line
    assert not out.exists()


def test_offline_warns_when_b_changes_a_trained_stage_and_takes_b_artifacts(toy: Path, tmp_path: Path) -> None:
    a, b = pipeline_yaml(tmp_path / "a.yaml"), pipeline_yaml(tmp_path / "b.yaml", depth=50)
    record_training(toy, a)
    out = tmp_path / "ab.json"
    res = offline(toy, a, b, "--out", str(out))
    assert res.exit_code == 0, res.output
    assert f"warning: B: stage(s) ['recall'] in {toy} were trained under other settings" in res.stderr
    assert any("B: stage(s) ['recall']" in w for w in json.loads(out.read_text())["warnings"])
    art_b = tmp_path / "art-b"
    shutil.copytree(toy / "split", art_b / "split")
    record_training(art_b, b)
    own = offline(toy, a, b, "--artifacts-b", str(art_b), "--out", str(out))
    assert own.exit_code == 0, own.output
    assert "trained under other settings" not in own.stderr
    (art_b / "recall" / "stage.json").write_text(json.dumps({"split_id": "0123456789abcdef"}))
    stale_b = offline(toy, a, b, "--artifacts-b", str(art_b))
    assert stale_b.exit_code == 2
    assert stale_b.stderr.strip().splitlines() == [
        f"error: {art_b}: stage(s) ['recall'] were trained on another split than the one in {art_b / 'split'} "
        "(it was prepared again since); run `recsys train` to retrain them"]


def test_offline_with_b_on_another_split_names_the_difference_in_one_line(tmp_path: Path) -> None:
    """`--artifacts-b` on a split prepared with the defaults, A's with --catalog listed: one error line
    naming the difference (catalog listed vs interacted) and the command that trains B on A's split."""
    shop = tmp_path / "shop"
    shop.mkdir()
    rows = [f"u{u},i{(u + j) % 12},{1000 + j}" for u in range(30) for j in range(8)]
    (shop / "interactions.csv").write_text("user_id,item_id,timestamp\n" + "\n".join(rows) + "\n")
    (shop / "items.csv").write_text("\n".join(["item_id,title", *(f"i{i},P{i}" for i in range(13))]) + "\n")
    art_a, art_b = tmp_path / "a", tmp_path / "b"
    for art, opts in ((art_a, ["--catalog", "listed"]), (art_b, [])):
        res = runner.invoke(app, ["prepare", "--data", str(shop), "--artifacts", str(art), *opts])
        assert res.exit_code == 0, res.output
    a = pipeline_yaml(tmp_path / "a.yaml")
    out = tmp_path / "ab.json"
    res = offline(art_a, a, a, "--artifacts-b", str(art_b), "--out", str(out))
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    assert res.stderr.strip().splitlines() == [
        f"error: {art_b}: B's artifact directory holds another split than {art_a} (catalog listed vs interacted); "
        "both variants must be trained on the split they are measured on: `recsys train --data DIR --config <B> "
        f"--artifacts {art_b} --k-core 5 --catalog listed`, DIR being the data A's split was prepared from ('shop')"]
    assert not out.exists()
