"""``recsys tag``: bad input is one ``error:`` line (exit 2) and writes nothing; stale tags are refused."""

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.cli.test_cli import _one_line_error
from tests.jobs.tagging.factories import catalog_split, prepared_again, tiny_model_dir

runner = CliRunner()


TAG_ARGS = ["--chunk-size", "2", "--batch-size", "2", "--max-new-tokens", "80", "--threads", "1"]


@pytest.fixture
def art(tmp_path: Path) -> Path:
    catalog_split(4).save(tmp_path / "art" / "split")
    return tmp_path / "art"


@pytest.fixture(scope="module")
def tagged_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 items tagged by ``recsys tag`` with the tiny tagger, once for the module (a real tag job each time
    costs seconds): the tests that start from a tagged catalog get a copy (``tagged``)."""
    art = tmp_path_factory.mktemp("tagged") / "art"
    catalog_split(4).save(art / "split")
    res = runner.invoke(app, ["tag", "--artifacts", str(art), "--model", str(tiny_model_dir()), *TAG_ARGS])
    assert res.exit_code == 0, res.output
    return art


@pytest.fixture
def tagged(tagged_once: Path, tmp_path: Path) -> Path:
    shutil.copytree(tagged_once, tmp_path / "art")
    return tmp_path / "art"


def test_a_model_path_that_does_not_exist_is_refused_before_anything_is_written(art: Path, tmp_path: Path):
    missing = tmp_path / "nonexistent"
    res = runner.invoke(app, ["tag", "--artifacts", str(art), "--fresh", "--model", str(missing), "--limit", "1"])
    _one_line_error(res, f"--model {missing}: no such directory")
    assert not (art / "tags").exists()


def test_a_model_directory_without_config_is_refused_before_anything_is_written(art: Path, tmp_path: Path):
    (tmp_path / "empty").mkdir()
    res = runner.invoke(app, ["tag", "--artifacts", str(art), "--model", str(tmp_path / "empty"), "--limit", "1"])
    _one_line_error(res, f"--model {tmp_path / 'empty'}: no config.json")
    assert not (art / "tags").exists()


def test_after_prepare_rebuilds_the_split_old_tags_are_refused_not_moved_onto_other_items(tagged: Path):
    art = tagged
    tag = ["tag", "--artifacts", str(art), "--model", str(tiny_model_dir()), *TAG_ARGS]
    prepared_again(catalog_split(4)).save(art / "split")
    _one_line_error(runner.invoke(app, tag), "another catalog", "--fresh")
    stale = str(art / "tags" / "tags.parquet")
    _one_line_error(runner.invoke(app, ["tag", "merge-items", "--artifacts", str(art)]), stale, "recsys tag")
    _one_line_error(runner.invoke(app, ["tag", "embed-train", "--artifacts", str(art), "--epochs", "1", "--dim", "8"]),
                    stale, "recsys tag")
    assert not (art / "tags" / "items.parquet").exists() and not (art / "tags" / "embed").exists()


def test_the_same_ids_prepared_again_with_new_titles_are_not_served_the_old_tags(tagged: Path):
    """Every title changed under the same ids: `recsys tag` tags again rather than count the old parts as
    done (which would serve "Gadget 0 is a comedy" for an item now titled as a horror film)."""
    art = tagged
    tag = ["tag", "--artifacts", str(art), "--model", str(tiny_model_dir()), *TAG_ARGS]
    split = catalog_split(4)
    split.items["title"] = [f"Retitled {i}" for i in range(4)]
    split.save(art / "split")
    _one_line_error(runner.invoke(app, tag), "another item titles or texts", "--fresh")


def _broken_model(tmp_path: Path, kind: str) -> Path:
    """A copy of the tiny tagger with one thing a load needs missing or broken."""
    broken = tmp_path / f"model-{kind}"
    broken.mkdir()
    rest = ["config.json", "tokenizer.json", "tokenizer_config.json"]
    keep = {"no-weights": ["config.json"], "no-tokenizer": ["config.json", "model.safetensors"],
            "config-not-json": ["model.safetensors"], "truncated": [*rest, "model.safetensors"],
            "torn-header": [*rest, "model.safetensors"], "bad-offsets": [*rest, "model.safetensors"],
            "bad-dtype": [*rest, "model.safetensors"], "index-without-map": rest, "bin-not-a-checkpoint": rest}[kind]
    for name in keep:
        (broken / name).write_bytes((tiny_model_dir() / name).read_bytes())
    weights = broken / "model.safetensors"
    if kind == "config-not-json":
        (broken / "config.json").write_text("not json")
    elif kind == "truncated":  # an interrupted download or copy
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif kind == "torn-header":
        weights.write_bytes(weights.read_bytes()[:100])
    elif kind == "bad-offsets":  # a tensor's data_offsets not two byte offsets, the header padded to its length
        data = weights.read_bytes()
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + n])
        header[next(k for k in header if k != "__metadata__")]["data_offsets"] = 5
        text = json.dumps(header, separators=(",", ":")).encode()
        weights.write_bytes(data[:8] + text.ljust(n) + data[8 + n:])
    elif kind == "bad-dtype":  # a whole file whose header only the loader refuses (SafetensorError)
        data = weights.read_bytes()
        weights.write_bytes(data.replace(b'"dtype":"F32"', b'"dtype":"X32"', 1))
    elif kind == "index-without-map":
        (broken / "model.safetensors.index.json").write_text("{}")
    elif kind == "bin-not-a-checkpoint":
        (broken / "pytorch_model.bin").write_text("hi\n")
    return broken


@pytest.mark.parametrize(("kind", "says"), [
    ("no-weights", "no model weights there"),
    ("config-not-json", "config.json: not valid JSON"),
    ("no-tokenizer", "the tagging model cannot be loaded"),
    # each one error line, not a traceback (SafetensorError, KeyError: 'weight_map', KeyError: 105)
    ("truncated", "model.safetensors: 3,183,964 bytes, but its header lists tensors up to byte 6,367,928 (truncated"),
    ("torn-header", "model.safetensors: not a whole safetensors file (100 bytes; its header cannot be read"),
    ("bad-dtype", "the tagging model cannot be loaded (SafetensorError: Error while deserializing header"),
    # one error line, not a TypeError traceback
    ("bad-offsets", "in its safetensors header has data_offsets 5, not two byte offsets"),
    ("index-without-map", "model.safetensors.index.json: not a shard index (no 'weight_map' object"),
    ("bin-not-a-checkpoint", "pytorch_model.bin: not a PyTorch checkpoint (it starts with b'hi\\n'"),
])
@pytest.mark.parametrize("engine", ["local", "ray"])
def test_fresh_with_a_model_that_cannot_load_is_one_error_line_and_keeps_every_part(tagged: Path, tmp_path: Path,
                                                                                   kind: str, says: str, engine: str):
    """The model is checked before --fresh deletes any part, on --engine ray too (where it would otherwise
    load only in the actors, after the parts were gone, and fail as a Ray traceback)."""
    art = tagged
    tag = ["tag", "--artifacts", str(art), *TAG_ARGS]
    tags = art / "tags"
    before = {p.relative_to(tags): p.read_bytes() for p in sorted(tags.rglob("*")) if p.is_file()}
    broken = _broken_model(tmp_path, kind)
    res = runner.invoke(app, [*tag, "--model", str(broken), "--fresh", "--engine", engine])
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit) and "Traceback" not in res.output
    [line] = [ln for ln in res.output.splitlines() if ln.startswith("error: ")]  # after transformers' progress bar
    assert str(broken) in line and says in line, line
    assert {p.relative_to(tags): p.read_bytes() for p in sorted(tags.rglob("*")) if p.is_file()} == before
