"""``staged_dir``: a directory of outputs replaced whole, or not at all."""

from pathlib import Path

import pytest

from jobs.tagging.staging import staged_dir


def _files(directory: Path) -> dict[str, str]:
    return {p.relative_to(directory).as_posix(): p.read_text() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_finished_block_swaps_the_new_set_in_whole(tmp_path: Path):
    target = tmp_path / "embed"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with staged_dir(target) as out:
        assert out.parent == tmp_path and out.name.startswith(".embed.tmp") and not any(out.iterdir())
        (out / "a.txt").write_text("a")
        (out / "index").mkdir()
        (out / "index" / "b.txt").write_text("b")
        assert _files(target) == {"old.txt": "old"}  # readers see the old set until the block ends
    assert _files(target) == {"a.txt": "a", "index/b.txt": "b"}
    assert [p.name for p in tmp_path.iterdir()] == ["embed"]


def test_a_block_that_raises_leaves_the_previous_set_untouched(tmp_path: Path):
    target = tmp_path / "embed"
    target.mkdir()
    (target / "embeddings.npy").write_text("32-d")
    (target / "meta.json").write_text("dim 32")
    with pytest.raises(OSError, match="disk full"), staged_dir(target) as out:
        (out / "embeddings.npy").write_text("16-d")
        raise OSError("disk full")
    assert _files(target) == {"embeddings.npy": "32-d", "meta.json": "dim 32"}
    assert [p.name for p in tmp_path.iterdir()] == ["embed"]


def test_a_target_that_does_not_exist_yet_is_created(tmp_path: Path):
    with staged_dir(tmp_path / "tags" / "embed") as out:
        (out / "x").write_text("x")
    assert _files(tmp_path / "tags" / "embed") == {"x": "x"}
