import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from jobs.tagging.embed import EmbedSettings, train_embeddings
from jobs.tagging.generate import TaggerSettings
from jobs.tagging.job import TagJob, finalize
from jobs.tagging.parts import VERSION_KEY
from jobs.tagging.run import TagOptions, tag_catalog
from jobs.tagging.schema import catalog_categories, concrete_schema, validation_errors
from jobs.tagging.wiring import write_tagged_items
from offline.tag_store import load_tags
from tests.jobs.tagging.factories import catalog_split, prepared_again, tiny_model_dir

ROOT = Path(__file__).resolve().parents[3]
FP32 = TaggerSettings(precision="fp32", max_new_tokens=80, threads=1)


@pytest.fixture(scope="module")
def tag_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, int], Path]:
    """Finished tag runs of this module, by (items, chunk size): each runs the tiny tagger once."""
    return {}


@pytest.fixture
def tagged(tag_runs: dict[tuple[int, int], Path], tmp_path_factory: pytest.TempPathFactory
           ) -> Callable[[Path, int, int], None]:
    """``tagged(artifact_dir, n, chunk_size=c)`` leaves under ``artifact_dir/tags`` what
    ``tag_catalog(catalog_split(n), tiny model, artifact_dir, FP32, chunk_size=c, batch_size=2)`` writes:
    the tests that start from a finished run damage or extend a copy of one run per shape."""
    def tagged_copy(artifact_dir: Path, n_items: int, chunk_size: int) -> None:
        if (n_items, chunk_size) not in tag_runs:
            done = tmp_path_factory.mktemp(f"tagged-{n_items}-{chunk_size}")
            tag_catalog(catalog_split(n_items), str(tiny_model_dir()), done, FP32,
                        TagOptions(chunk_size=chunk_size,
                                   batch_size=2, progress=False))
            tag_runs[n_items, chunk_size] = done
        shutil.copytree(tag_runs[n_items, chunk_size] / "tags", Path(artifact_dir) / "tags")

    return tagged_copy


def _digests(tags_dir: Path) -> dict[str, str]:
    manifest = json.loads((tags_dir / "manifest.json").read_text())
    out = {k: v["sha256"] for k, v in manifest["chunks"].items()}
    for name in ("tags.parquet", "hidden.npy"):
        out[name] = hashlib.sha256((tags_dir / name).read_bytes()).hexdigest()
    return out


def test_every_item_gets_one_schema_valid_record_or_an_explicit_fallback(tmp_path):
    split = catalog_split(6)
    summary = tag_catalog(split, str(tiny_model_dir()), tmp_path, FP32,
                          TagOptions(chunk_size=4, batch_size=2, progress=False))
    tags, hidden, version = load_tags(tmp_path / "tags")
    assert tags["item_idx"].tolist() == list(range(6))
    assert tags["item_id"].tolist() == [f"i{i}" for i in range(6)]
    assert hidden.shape == (6, 32) and hidden.dtype == np.float32
    schema = concrete_schema(catalog_categories(split.items["categories"]))
    assert version["categories"] == ["Animation", "Children's", "Horror"]
    for row in tags.itertuples():
        if not row.fallback:
            record = {"genres": list(row.genres), "audience": row.audience, "risk_flags": list(row.risk_flags),
                      "themes": list(row.themes), "summary": row.summary}
            assert validation_errors(record, schema) == []
            assert json.loads(row.raw)["audience"] == row.audience
    assert summary["items"] == 6 and summary["fallbacks"] == int(tags["fallback"].sum())
    assert summary["schema_valid_rate"] == pytest.approx(1 - summary["fallbacks"] / 6)


def test_a_budget_too_small_for_any_json_yields_fallbacks_not_gaps(tmp_path):
    split = catalog_split(3)
    tight = TaggerSettings(precision="fp32", max_new_tokens=8, threads=1)
    summary = tag_catalog(split, str(tiny_model_dir()), tmp_path, tight,
                          TagOptions(chunk_size=4, batch_size=3, progress=False))
    tags = pd.read_parquet(tmp_path / "tags" / "tags.parquet")
    assert summary["fallbacks"] == 3 and summary["schema_valid_rate"] == 0.0
    assert tags["fallback"].all() and tags["attempts"].eq(2).all()
    assert all("retry" in r for r in tags["reason"]) and tags["genres"].map(len).eq(0).all()


def test_rerun_after_losing_a_part_reproduces_identical_files(tagged, tmp_path):
    split = catalog_split(6)
    tagged(tmp_path, 6, chunk_size=2)
    before = _digests(tmp_path / "tags")
    (tmp_path / "tags" / "parts" / "chunk-00001.parquet").unlink()
    summary = tag_catalog(split, str(tiny_model_dir()), tmp_path, FP32,
                          TagOptions(chunk_size=2, batch_size=2, progress=False))
    assert summary["items_tagged_this_run"] == 2
    assert _digests(tmp_path / "tags") == before
    with pytest.raises(ValueError, match="fresh"):
        tag_catalog(split, str(tiny_model_dir()), tmp_path, FP32,
                    TagOptions(chunk_size=3, batch_size=2, progress=False))


def test_a_split_prepared_again_refuses_the_old_parts_and_the_old_tags(tagged, tmp_path):
    split = catalog_split(4)
    tagged(tmp_path, 4, chunk_size=2)
    again = prepared_again(split)  # the same items, reversed: item_idx 0 is now i3
    with pytest.raises(ValueError, match=r"another catalog \(the split was prepared again\).*--fresh"):
        tag_catalog(again, str(tiny_model_dir()), tmp_path, FP32,
                    TagOptions(chunk_size=2, batch_size=2, progress=False))
    stale = str(tmp_path / "tags" / "tags.parquet")
    with pytest.raises(ValueError, match=rf"{stale}: row 0 holds the tags of item 'i0' but .* is 'i3'.*recsys tag"):
        write_tagged_items(again, tmp_path / "tags")
    with pytest.raises(ValueError, match=rf"{stale}: row 0 .*recsys tag"):
        train_embeddings(again, tmp_path / "tags", EmbedSettings(dim=8, hidden=16, epochs=1))
    assert not (tmp_path / "tags" / "items.parquet").exists() and not (tmp_path / "tags" / "embed").exists()
    tag_catalog(again, str(tiny_model_dir()), tmp_path, FP32,
                TagOptions(chunk_size=2, batch_size=2, fresh=True, progress=False))
    after = load_tags(tmp_path / "tags")[0]
    assert after["item_id"].tolist() == ["i3", "i2", "i1", "i0"]
    assert write_tagged_items(again, tmp_path / "tags")["items"] == 4


def test_a_short_part_of_a_limit_run_is_redone_by_a_larger_run(tmp_path):
    split = catalog_split(6)
    whole = tag_catalog(split, str(tiny_model_dir()), tmp_path / "whole", FP32,
                        TagOptions(chunk_size=4, batch_size=2,
                                   progress=False))
    limited = tag_catalog(split, str(tiny_model_dir()), tmp_path / "run", FP32,
                          TagOptions(chunk_size=4, batch_size=2, limit=5,
                                     progress=False))
    assert limited["items"] == 5
    manifest = json.loads((tmp_path / "run" / "tags" / "manifest.json").read_text())
    assert {k: v["items"] for k, v in manifest["chunks"].items()} == {"chunk-00000": 4, "chunk-00001": 1}
    summary = tag_catalog(split, str(tiny_model_dir()), tmp_path / "run", FP32,
                          TagOptions(chunk_size=4, batch_size=2,
                                     progress=False))
    assert summary["items"] == 6 and summary["items_tagged_this_run"] == 2  # chunk 1 redone whole
    assert load_tags(tmp_path / "run" / "tags")[0]["item_idx"].tolist() == list(range(6))
    assert _digests(tmp_path / "run" / "tags") == _digests(tmp_path / "whole" / "tags")
    assert summary["genre_f1_micro"] == whole["genre_f1_micro"]


def test_a_limit_run_after_a_complete_run_keeps_every_part_and_the_whole_table(tagged, tmp_path):
    split = catalog_split(6)
    tagged(tmp_path, 6, chunk_size=4)
    before = _digests(tmp_path / "tags")
    summary = tag_catalog(split, str(tiny_model_dir()), tmp_path, FP32,
                          TagOptions(chunk_size=4, batch_size=2, limit=5,
                                     progress=False))
    assert summary["items_tagged_this_run"] == 0  # chunk 1 holds items 4..5: more than the limit asks, so done
    assert summary["items"] == 6 and summary["table_written"] is True
    assert _digests(tmp_path / "tags") == before
    assert load_tags(tmp_path / "tags")[0]["item_id"].tolist() == [f"i{i}" for i in range(6)]


def test_a_limit_run_short_of_the_catalog_writes_no_table_and_leaves_the_one_there(tagged, tmp_path):
    split = catalog_split(10)
    tagged(tmp_path, 10, chunk_size=4)
    table = _digests(tmp_path / "tags")["tags.parquet"]
    for chunk in (1, 2):
        (tmp_path / "tags" / "parts" / f"chunk-0000{chunk}.parquet").unlink()
    summary = tag_catalog(split, str(tiny_model_dir()), tmp_path, FP32,
                          TagOptions(chunk_size=4, batch_size=2, limit=5,
                                     progress=False))
    assert summary["items"] == 5 and summary["items_tagged_this_run"] == 1 and summary["table_written"] is False
    assert _digests(tmp_path / "tags")["tags.parquet"] == table
    assert len(load_tags(tmp_path / "tags")[0]) == 10


def test_a_logits_limit_run_refuses_to_replace_parts_past_its_limit(tagged, tmp_path):
    split = catalog_split(10)
    tagged(tmp_path, 10, chunk_size=4)
    before = _digests(tmp_path / "tags")
    with pytest.raises(ValueError, match=r"parts: chunk-00001.parquet, chunk-00002.parquet there hold tags past "
                                         r"item 4; a --method logits run .* rerun without --limit, or with --fresh"):
        tag_catalog(split, str(tiny_model_dir()), tmp_path, FP32,
                    TagOptions(method="logits", chunk_size=4, batch_size=4,
                               limit=5, progress=False))
    assert _digests(tmp_path / "tags") == before
    assert sorted(p.name for p in (tmp_path / "tags" / "parts").iterdir()) == [
        "chunk-00000.parquet", "chunk-00001.parquet", "chunk-00002.parquet"]


@pytest.mark.parametrize("damage", ["torn", "empty", "rewritten"])
def test_a_damaged_part_is_redone_and_the_files_match_an_undamaged_run(tagged, tmp_path, damage):
    split = catalog_split(6)
    tagged(tmp_path, 6, chunk_size=2)
    before = _digests(tmp_path / "tags")
    part = tmp_path / "tags" / "parts" / "chunk-00001.parquet"
    if damage == "torn":
        part.write_bytes(part.read_bytes()[:1000])
    elif damage == "empty":
        part.write_bytes(b"")
    else:  # still a readable part of two rows, but not the file the manifest recorded
        pd.read_parquet(part).assign(summary="edited").to_parquet(part, index=False)
    summary = tag_catalog(split, str(tiny_model_dir()), tmp_path, FP32,
                          TagOptions(chunk_size=2, batch_size=2, progress=False))
    assert summary["items_tagged_this_run"] == 2 and list(summary["damaged_parts"]) == ["chunk-00001.parquet"]
    assert ("cannot be read" if damage != "rewritten" else "sha256") in summary["damaged_parts"]["chunk-00001.parquet"]
    assert _digests(tmp_path / "tags") == before


def test_a_part_that_cannot_be_read_is_named_by_finalize(tagged, tmp_path):
    split = catalog_split(4)
    tagged(tmp_path, 4, chunk_size=2)
    tags_dir = tmp_path / "tags"
    part = tags_dir / "parts" / "chunk-00001.parquet"
    part.write_bytes(b"")
    job = TagJob(tags_dir, split.items, json.loads((tags_dir / "manifest.json").read_text())["version"], 2, 2)
    with pytest.raises(ValueError, match=rf"{part}: cannot be read .*rerun `recsys tag` to redo it"):
        finalize(job)


def test_finalize_names_a_gap_and_overwrites_nothing(tagged, tmp_path):
    split = catalog_split(6)
    tagged(tmp_path, 6, chunk_size=2)
    tags_dir = tmp_path / "tags"
    before = _digests(tags_dir)
    part = tags_dir / "parts" / "chunk-00001.parquet"
    pd.read_parquet(part).iloc[:1].to_parquet(part, index=False)  # a part short of item 3
    job = TagJob(tags_dir, split.items, json.loads((tags_dir / "manifest.json").read_text())["version"], 2, 2)
    with pytest.raises(ValueError, match=r"items 0\.\.5 .*missing 3, .*--fresh"):
        finalize(job)
    for name in ("tags.parquet", "hidden.npy"):
        assert hashlib.sha256((tags_dir / name).read_bytes()).hexdigest() == before[name]


def _files(tags_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(tags_dir)): p.read_bytes() for p in sorted(tags_dir.rglob("*")) if p.is_file()}


def _strip_versions(parts: Path) -> None:
    """Rewrite every part as parts were written before they carried their job version."""
    for part in sorted(parts.glob("chunk-*.parquet")):
        table = pq.read_table(part)
        meta = {k: v for k, v in (table.schema.metadata or {}).items() if k != VERSION_KEY}
        pq.write_table(table.replace_schema_metadata(meta), part)


def test_without_its_manifest_a_part_is_checked_against_its_own_version(tagged, tmp_path):
    """With manifest.json deleted, parts decoded with max_new_tokens 80 are not counted as done for a run
    with 40 (and version.json does not claim 40 for them)."""
    split = catalog_split(4)
    tagged(tmp_path, 4, chunk_size=2)
    tags = tmp_path / "tags"
    before = _files(tags)
    (tags / "manifest.json").unlink()
    other = TaggerSettings(precision="fp32", max_new_tokens=40, threads=1)
    with pytest.raises(ValueError, match=r"^.*parts: the parts there were made with another decoding settings than "
                                         r"this run; rerun with --fresh \(fresh=True\) to discard them and start over$"):
        tag_catalog(split, str(tiny_model_dir()), tmp_path, other,
                    TagOptions(chunk_size=2, batch_size=2, progress=False))
    assert _files(tags) == {k: v for k, v in before.items() if k != "manifest.json"}
    summary = tag_catalog(split, str(tiny_model_dir()), tmp_path, FP32,
                          TagOptions(chunk_size=2, batch_size=2, progress=False))
    assert summary["items_tagged_this_run"] == 0 and "damaged_parts" not in summary
    assert {k: v for k, v in _files(tags).items() if k != "summary.json"} == {
        k: v for k, v in before.items() if k != "summary.json"}  # the manifest rebuilt as it was


def test_parts_without_a_version_of_their_own_or_a_manifest_are_refused(tagged, tmp_path):
    split = catalog_split(4)
    tagged(tmp_path, 4, chunk_size=2)
    tags = tmp_path / "tags"
    _strip_versions(tags / "parts")
    summary = tag_catalog(split, str(tiny_model_dir()), tmp_path, FP32,
                          TagOptions(chunk_size=2, batch_size=2, progress=False))
    assert "damaged_parts" in summary  # their sha256 changed: redone under the manifest, with their version
    _strip_versions(tags / "parts")
    (tags / "manifest.json").unlink()
    before = _files(tags)
    with pytest.raises(ValueError) as refused:
        tag_catalog(split, str(tiny_model_dir()), tmp_path, FP32,
                    TagOptions(chunk_size=2, batch_size=2, progress=False))
    assert str(refused.value) == (
        f"{tags / 'manifest.json'} is missing, and chunk-00000.parquet, chunk-00001.parquet in {tags / 'parts'} carry "
        "no version of their own (written before parts recorded it), so what made them cannot be established; "
        "rerun with --fresh (fresh=True) to discard them and start over")
    assert _files(tags) == before


MALFORMED = {"{}": lambda m: {}, "[]": lambda m: [], "version 1": lambda m: {"version": 1},
             "pairs": lambda m: [["version", 1]], "no chunks": lambda m: {"version": m["version"]},
             "chunks a list": lambda m: {**m, "chunks": []},
             "a record a string": lambda m: {**m, "chunks": {**m["chunks"], "chunk-00000": "x"}}}


@pytest.mark.parametrize("shape", list(MALFORMED))
def test_a_manifest_of_another_shape_is_rebuilt_from_parts_that_carry_their_version(tagged, tmp_path, shape):
    """A manifest of another shape is rebuilt, not a KeyError / TypeError / AttributeError traceback."""
    split = catalog_split(4)
    tagged(tmp_path, 4, chunk_size=2)
    path = tmp_path / "tags" / "manifest.json"
    good = json.loads(path.read_text())
    path.write_text(json.dumps(MALFORMED[shape](good)))
    summary = tag_catalog(split, str(tiny_model_dir()), tmp_path, FP32,
                          TagOptions(chunk_size=2, batch_size=2, limit=3,
                                     progress=False))
    assert summary["items_tagged_this_run"] == 0 and "damaged_parts" not in summary
    assert json.loads(path.read_text()) == good
    _strip_versions(tmp_path / "tags" / "parts")  # parts from before they carried a version: nothing vouches for them
    path.write_text(json.dumps(MALFORMED[shape](good)))
    with pytest.raises(ValueError, match=rf"^{path} is not a tagging manifest \(.+\), and chunk-00000.parquet, "
                                         r"chunk-00001.parquet in .* carry no version of their own .*--fresh"):
        tag_catalog(split, str(tiny_model_dir()), tmp_path, FP32,
                    TagOptions(chunk_size=2, batch_size=2, progress=False))


def test_a_part_renamed_in_before_its_manifest_write_is_kept_not_called_damaged(tmp_path):
    """A kill between a part's rename and the manifest write leaves a whole, correct part whose sha256 the
    manifest has not recorded: it is kept, not called damaged, deleted and redone."""
    split = catalog_split(6)
    full = tag_catalog(split, str(tiny_model_dir()), tmp_path / "full", FP32,
                       TagOptions(chunk_size=2, batch_size=2,
                                  progress=False))
    assert full["items_tagged_this_run"] == 6
    tag_catalog(split, str(tiny_model_dir()), tmp_path / "run", FP32,
                TagOptions(chunk_size=2, batch_size=2, limit=3,
                           progress=False))  # parts 0 (2 items) and 1 (1 item)
    parts = tmp_path / "run" / "tags" / "parts"
    # the state a kill leaves: chunk 1 redone whole and renamed in, the manifest still the 1-item part's
    (parts / "chunk-00001.parquet").write_bytes((tmp_path / "full" / "tags" / "parts" / "chunk-00001.parquet").read_bytes())
    summary = tag_catalog(split, str(tiny_model_dir()), tmp_path / "run", FP32,
                          TagOptions(chunk_size=2, batch_size=2,
                                     progress=False))
    assert summary["items_tagged_this_run"] == 2 and "damaged_parts" not in summary
    assert _digests(tmp_path / "run" / "tags") == _digests(tmp_path / "full" / "tags")
    # a part of the right items but of another chunk's content is still damaged
    (parts / "chunk-00002.parquet").write_bytes((parts / "chunk-00001.parquet").read_bytes())
    summary = tag_catalog(split, str(tiny_model_dir()), tmp_path / "run", FP32,
                          TagOptions(chunk_size=2, batch_size=2,
                                     progress=False))
    assert summary["damaged_parts"] == {"chunk-00002.parquet": "its sha256 is not the one manifest.json recorded, and "
                                                              "it does not hold items 4.. of its chunk in order"}
    assert _digests(tmp_path / "run" / "tags") == _digests(tmp_path / "full" / "tags")


JOB = """
import sys
from pathlib import Path
from offline.split import Split
from jobs.tagging.embed import EmbedSettings, train_embeddings
from jobs.tagging.generate import TaggerSettings
from jobs.tagging.job import TagJob, finalize
from jobs.tagging.run import TagOptions, tag_catalog
from jobs.tagging.wiring import write_tagged_items
tag_catalog(Split.load(Path(sys.argv[1])), sys.argv[2], Path(sys.argv[3]),
            TaggerSettings(precision="fp32", max_new_tokens=80, threads=1),
            TagOptions(chunk_size=2, batch_size=2, progress=False))
"""


def _job(split_dir: Path, out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", JOB, str(split_dir), str(tiny_model_dir()), str(out)], env=env,
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.mark.slow
def test_sigkill_mid_job_then_rerun_matches_an_uninterrupted_run(tmp_path):
    split = catalog_split(40)
    split.save(tmp_path / "split")
    whole = _job(tmp_path / "split", tmp_path / "whole")
    assert whole.wait(timeout=600) == 0, whole.stderr.read().decode()[-2000:]
    killed = _job(tmp_path / "split", tmp_path / "killed")
    parts = tmp_path / "killed" / "tags" / "parts"
    while not list(parts.glob("chunk-*.parquet")) and killed.poll() is None:
        time.sleep(0.01)
    time.sleep(0.3)  # let it get inside a later chunk (a tmp write may be in flight)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    done = len(list(parts.glob("chunk-*.parquet")))
    assert 0 < done < 20, f"kill landed after {done}/20 chunks; the test needs a mid-job kill"
    rerun = _job(tmp_path / "split", tmp_path / "killed")
    assert rerun.wait(timeout=600) == 0, rerun.stderr.read().decode()[-2000:]
    assert _digests(tmp_path / "killed" / "tags") == _digests(tmp_path / "whole" / "tags")
