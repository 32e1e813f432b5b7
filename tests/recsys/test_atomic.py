from __future__ import annotations

import json

import numpy as np
import pytest

from recsys.atomic import atomic_write, atomic_write_json, atomic_write_text


def test_writes_through_a_handle_so_np_save_lands_on_the_target(tmp_path):
    target = tmp_path / "v.npy"
    atomic_write(target, lambda fh: np.save(fh, np.arange(3)))
    assert np.load(target).tolist() == [0, 1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.npy"]


def test_a_failing_writer_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "meta.json"
    atomic_write_json(target, {"v": 1})

    def broken(fh):
        fh.write(b'{"v": ')
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError, match="killed"):
        atomic_write(target, broken)
    assert json.loads(target.read_text()) == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta.json"]


def test_text_is_utf8(tmp_path):
    atomic_write_text(tmp_path / "t.txt", "Amélie")
    assert (tmp_path / "t.txt").read_bytes() == "Amélie".encode()


def test_the_next_write_removes_temporaries_of_dead_writers_only(tmp_path):
    import os
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".w.json.tmp{int(dead.stdout)}"
    live = tmp_path / f".w.json.tmp{os.getppid()}"  # a running process that is not this writer
    stale.write_bytes(b"half")
    live.write_bytes(b"in flight")
    atomic_write_text(tmp_path / "w.json", "{}")
    assert not stale.exists() and live.exists()
    assert (tmp_path / "w.json").read_text() == "{}"
