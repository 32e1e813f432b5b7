"""Atomic file writes: write beside the target, fsync-free rename over it (``os.replace``).

A reader sees the old file or the new one, never half of one. The temporary sibling is
``.<name>.tmp<pid>``, so two processes writing the same target never share one; a killed writer
leaves its dot-file behind, and the next write of that target removes the ones whose process is
gone. The one implementation every artifact writer uses (models, splits, reports, tag parts,
weights).

Deliberately left out: fsync before the rename (artifacts are rebuilt from their inputs after a
crash of the machine itself), and directories (``llm_rerank.backbone`` renames a whole temporary
directory, which ``os.replace`` cannot do over a non-empty one).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np


def tmp_path(path: Path) -> Path:
    """The temporary sibling a write of ``path`` goes through (unique per process)."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def atomic_write(path: Path | str, write: Callable[[IO[bytes]], Any]) -> Path:
    """Call ``write(binary file handle)`` on a temporary sibling, then rename it over ``path``.

    A handle rather than a path, so that writers that add suffixes to bare paths (``np.save``
    appends ``.npy``) write where they are told. The temporary file is removed if ``write`` raises.
    """
    path = Path(path)
    _remove_stale(path)
    tmp = tmp_path(path)
    try:
        with tmp.open("wb") as fh:
            write(fh)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _remove_stale(path: Path) -> None:
    """Delete temporary siblings of ``path`` left by writers that are no longer running."""
    stem = f".{path.name}.tmp"
    for tmp in path.parent.glob(f"{stem}*"):
        pid = tmp.name[len(stem):]
        if pid == "" or (pid.isdigit() and not _running(int(pid))):
            tmp.unlink(missing_ok=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def atomic_write_bytes(path: Path | str, data: bytes) -> Path:
    return atomic_write(path, lambda fh: fh.write(data))


def atomic_write_text(path: Path | str, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def json_default(o: Any) -> Any:
    """``json.dumps``' ``default`` for numpy values (a scalar as its Python value, an array as a
    list, whose numpy elements come back here) and anything else as its ``str``."""
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def atomic_write_json(path: Path | str, obj: Any, *, indent: int | None = 2, default: Any = None) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent, default=default))
