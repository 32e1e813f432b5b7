"""Where a result file came from: the command, commit, configuration, data, machine, seeds and date.

Every benchmark and evaluation file under ``results/`` carries a ``provenance`` block, so a
figure quoted in the docs can be traced to the run that produced it and re-run. ``write_result``
is the one writer: it adds the block and writes the file atomically.

Deliberately left out: package versions beyond Python's and torch's (``requirements.lock`` pins
them, and the commit names the lock file), and environment variables (they may hold secrets).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recsys.atomic import atomic_write_text, json_default
from recsys.digest import file_sha256, json_sha256

REPO_ROOT = Path(__file__).resolve().parent.parent


def git_commit(root: Path = REPO_ROOT) -> str | None:
    """The checked-out commit, with ``+dirty`` when tracked files differ from it; None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (``platform.processor()`` where there is no /proc)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def dataset_digest(path: Path | str | None) -> str | None:
    """A short digest of a dataset: its files' names and SHA-256 (a directory) or the file's own.

    Hidden files and files under hidden folders are skipped (editor and tool droppings).
    """
    if path is None:
        return None
    path = Path(path)
    if path.is_file():
        return file_sha256(path)[:16]
    if not path.is_dir():
        return None
    files = sorted(p for p in path.rglob("*")
                   if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts))
    return json_sha256([[str(p.relative_to(path)), file_sha256(p)] for p in files])[:16]


def machine() -> dict[str, Any]:
    """The machine a figure was measured on: CPU model, usable cores, memory, Python and torch."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 0
    try:
        mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        mem_gib = None
    torch_version = sys.modules["torch"].__version__ if "torch" in sys.modules else None
    return {"cpu": cpu_model(), "cores": cores, "memory_gib": mem_gib,
            "python": platform.python_version(), "torch": torch_version}


def provenance(*, argv: Sequence[str] | None = None, config: Any = None,
               data: Path | str | Sequence[Path | str] | None = None,
               seeds: Sequence[int] | None = None) -> dict[str, Any]:
    """The provenance block of a result: ``argv`` defaults to this process's command line.

    ``config`` is any JSON-able value (a settings dump); its digest is recorded, not the value.
    ``data`` is one dataset path or several (a battery over shapes).
    """
    command = list(sys.argv if argv is None else argv)
    if command:
        command[0] = Path(command[0]).name
    datasets: list[Path | str] = [] if data is None else [data] if isinstance(data, (str, Path)) else list(data)
    return {
        "command": " ".join(command),
        "commit": git_commit(),
        "config_digest": None if config is None else json_sha256(config)[:16],
        "datasets": {str(d): dataset_digest(d) for d in datasets},
        "machine": machine(),
        "seeds": None if seeds is None else [int(s) for s in seeds],
        "date": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
    }


def write_result(path: Path | str, payload: dict[str, Any], *, argv: Sequence[str] | None = None,
                 config: Any = None, data: Path | str | Sequence[Path | str] | None = None,
                 seeds: Sequence[int] | None = None) -> Path:
    """Write ``payload`` with its ``provenance`` block (first key) to ``path``, atomically.

    Strict JSON (a NaN or infinity in ``payload`` is refused, not written as the non-JSON ``NaN``:
    callers replace undefined numbers first), two-space indent, one trailing newline.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    block = provenance(argv=argv, config=config, data=data, seeds=seeds)
    body = {"provenance": block, **{k: v for k, v in payload.items() if k != "provenance"}}
    text = json.dumps(body, indent=2, default=json_default, allow_nan=False)
    return atomic_write_text(path, text + "\n")
