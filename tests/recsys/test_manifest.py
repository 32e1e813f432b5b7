"""Artifact manifests: what a stage's directory lists, and how a missing or damaged file is refused."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from recsys.manifest import (
    MANIFEST_FILE,
    ArtifactIntegrityError,
    damaged_file,
    recorded_files,
    verify_directory,
    write_manifest,
)


def trained_dir(root: Path) -> Path:
    (root / "index").mkdir(parents=True)
    (root / "model.txt").write_text("tree\n")
    (root / "index" / "index.faiss").write_bytes(b"\x00\x01")
    (root / ".model.txt.tmp123").write_text("torn")  # an atomic write's temporary sibling
    (root / "text_cache").mkdir()
    (root / "text_cache" / "abc.npy").write_bytes(b"cache")
    (root / "nested").mkdir()
    (root / "nested" / "stage.json").write_text("{}")  # another stage's folder
    (root / "nested" / "weights.json").write_text("{}")
    (root / "stage.json").write_text("{}")
    return root


def test_the_manifest_lists_the_stage_files_and_nothing_else(tmp_path: Path) -> None:
    write_manifest(trained_dir(tmp_path / "coarse"))
    assert sorted(recorded_files(tmp_path / "coarse") or {}) == ["index/index.faiss", "model.txt"]
    assert verify_directory(tmp_path / "coarse") is True


@pytest.mark.parametrize("damage", ["truncate", "flip", "remove"])
def test_a_damaged_or_missing_file_is_refused_by_name(tmp_path: Path, damage: str) -> None:
    root = trained_dir(tmp_path / "coarse")
    write_manifest(root)
    target = root / "index" / "index.faiss"
    if damage == "truncate":
        target.write_bytes(b"\x00")
    elif damage == "flip":
        target.write_bytes(b"\x00\x02")
    else:
        target.unlink()
    with pytest.raises(ArtifactIntegrityError, match="missing" if damage == "remove" else "damaged") as info:
        verify_directory(root)
    assert info.value.path == target and str(target) in str(info.value)
    assert damaged_file(RuntimeError("another failure")) is None
    try:
        raise RuntimeError("load failed") from info.value
    except RuntimeError as wrapped:
        assert damaged_file(wrapped) == target


def test_files_added_after_training_and_caches_are_not_checked(tmp_path: Path) -> None:
    root = trained_dir(tmp_path / "recall")
    write_manifest(root)
    (root / "text_cache" / "abc.npy").write_bytes(b"rebuilt")
    (root / "nested" / "weights.json").write_text('{"other": 1}')
    (root / "new.json").write_text("{}")
    assert verify_directory(root) is True


@pytest.mark.parametrize("text", ["not json", '{"files": ["model.txt"]}', '{"files": {"model.txt": 3}}', "{}"])
def test_an_unreadable_manifest_is_itself_refused(tmp_path: Path, text: str) -> None:
    root = trained_dir(tmp_path / "coarse")
    (root / MANIFEST_FILE).write_text(text)
    with pytest.raises(ArtifactIntegrityError, match="unreadable manifest"):
        verify_directory(root)


def test_a_manifest_cannot_name_files_outside_its_directory(tmp_path: Path) -> None:
    root = trained_dir(tmp_path / "coarse")
    (tmp_path / "secret").write_text("x")
    (root / MANIFEST_FILE).write_text(json.dumps({"files": {"../secret": "0" * 64}}))
    with pytest.raises(ArtifactIntegrityError, match="outside"):
        verify_directory(root)


def test_artifacts_trained_before_manifests_load_with_one_warning(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    root = trained_dir(tmp_path / "old")
    with caplog.at_level(logging.WARNING, logger="recsys.manifest"):
        assert verify_directory(root) is False
        assert verify_directory(root) is False
    warned = [r.getMessage() for r in caplog.records if "unverified" in r.getMessage()]
    assert len(warned) == 1 and str(root) in warned[0] and "recsys train" in warned[0]


def test_a_folder_being_trained_is_neither_checked_nor_warned_about(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    root = trained_dir(tmp_path / "fresh")
    (root / "stage.json").unlink()
    with caplog.at_level(logging.WARNING, logger="recsys.manifest"):
        assert verify_directory(root) is False
    assert not caplog.records


def test_a_lost_manifest_or_one_that_does_not_cover_the_loaded_file_is_refused(tmp_path: Path) -> None:
    """Deleting manifest.json (or emptying it) turned verification off, and a torn LightGBM model aborted again."""
    root = trained_dir(tmp_path / "coarse")
    write_manifest(root)
    (root / "stage.json").write_text(json.dumps({"serving_config_id": "abc"}))  # as training writes it now
    (root / MANIFEST_FILE).write_text(json.dumps({"algorithm": "sha256", "files": {}}))
    with pytest.raises(ArtifactIntegrityError, match="does not list model.txt, which this stage loads"):
        verify_directory(root, loads=("model.txt",))
    (root / MANIFEST_FILE).unlink()
    with pytest.raises(ArtifactIntegrityError, match="missing: training recorded the digests"):
        verify_directory(root, loads=("model.txt",))
