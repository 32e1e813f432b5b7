"""The reliability report: every reliability run, one result file (``recsys bench reliability``).

``run_report`` runs the pieces of ``serving.reliability`` that are installed, grouped as
``rules`` (concurrent publishes, publish then kill), ``artifacts`` (each damaged file) and
``events`` (durability, anonymous flood), each in its own ``try``: a run that fails is
recorded as ``{"error": ...}`` with its wall time, and the others still run. A piece whose
module is absent is recorded as ``{"skipped": ...}``. Sizes are arguments, so a quick run
(``--requests 500 --trials 2 --events 200 --flood-seconds 3``) exercises the same code.

The modules are imported inside the runs: each starts servers and loads heavy libraries, and
one that fails to import must not take the others down with it.

Deliberately left out: thresholds and verdicts (the figures are in the file; the tests assert
the behaviour).
"""

from __future__ import annotations

import importlib
import logging
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cascade.settings import Settings

log = logging.getLogger(__name__)
GROUPS = ("rules", "artifacts", "events")


@dataclass(frozen=True)
class Sizes:
    """How big each run is; the defaults are the full report's."""

    requests: int = 10_000  # answers checked under concurrent publishes
    trials: int = 20  # publish-then-kill trials
    events: int = 1_600  # events posted before Redis is killed
    flood_seconds: float = 20.0
    flood_users: int = 10_000


@dataclass(frozen=True)
class Piece:
    group: str
    name: str
    module: str  # under serving.reliability
    call: Callable[[Any, Path], dict[str, Any]]  # (module, its work dir) -> result


def pieces(artifact_dir: Path, sizes: Sizes, settings: Settings | None, config: Path | None) -> list[Piece]:
    """Every run of the report, in the order it runs."""
    art = Path(artifact_dir)
    return [
        Piece("rules", "concurrent_publish", "rules", lambda m, w: m.concurrent_publish(art, w, requests=sizes.requests)),
        Piece("rules", "publish_then_kill", "rules", lambda m, w: m.publish_then_kill(art, w, trials=sizes.trials)),
        Piece("artifacts", "damaged_artifacts", "artifacts", lambda m, w: m.damaged_artifacts(art, w, config=config)),
        Piece("events", "event_durability", "events",
              lambda m, w: m.event_durability(art, w, events=sizes.events, settings=settings)),
        Piece("events", "anonymous_flood", "events",
              lambda m, w: m.anonymous_flood(art, w, seconds=sizes.flood_seconds, users=sizes.flood_users,
                                             settings=settings)),
    ]


def run_piece(piece: Piece, work_dir: Path) -> dict[str, Any]:
    """One run: its result with ``wall_s``, or ``{"error"}`` / ``{"skipped"}``; never raises (but Ctrl-C)."""
    t0 = time.monotonic()
    name = f"serving.reliability.{piece.module}"
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:  # the module is there but something it imports is not: a failure, not a skip
            return {"error": f"{type(exc).__name__}: {exc}", "wall_s": round(time.monotonic() - t0, 3)}
        return {"skipped": f"{name} is not installed"}
    run_dir = work_dir / piece.name
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        result = piece.call(module, run_dir)
    except Exception as exc:  # recorded, so one broken run does not cost the others
        log.error("reliability run %s failed:\n%s", piece.name, traceback.format_exc())
        return {"error": f"{type(exc).__name__}: {exc}", "wall_s": round(time.monotonic() - t0, 3)}
    return {**result, "wall_s": round(time.monotonic() - t0, 3)}


def run_report(artifact_dir: Path, *, only: Iterable[str] = GROUPS, sizes: Sizes = Sizes(),
               settings: Settings | None = None, config: Path | None = None, work_dir: Path | None = None,
               progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The report dict: per group, per run, its figures (see the module docstring).

    ``work_dir`` (default: a temporary directory, removed afterwards) holds the copies, logs and
    Redis state of the runs; ``only`` picks groups out of ``GROUPS``.
    """
    chosen = list(dict.fromkeys(only))
    unknown = sorted(set(chosen) - set(GROUPS))
    if unknown or not chosen:
        raise ValueError(f"only: unknown group(s) {unknown}, choose among {list(GROUPS)}" if unknown
                         else f"only: choose at least one of {list(GROUPS)}")
    own = work_dir is None
    work = Path(tempfile.mkdtemp(prefix="recsys-reliability-")) if work_dir is None else Path(work_dir)
    report: dict[str, Any] = {"artifacts": str(Path(artifact_dir).resolve()), "sizes": sizes.__dict__,
                              **{g: {} for g in chosen}}
    try:
        for piece in pieces(artifact_dir, sizes, settings, config):
            if piece.group not in chosen:
                continue
            if progress is not None:
                progress(f"{piece.group}: {piece.name}")
            report[piece.group][piece.name] = run_piece(piece, work)
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)
    report["errors"] = [f"{g}.{n}" for g in chosen for n, r in report[g].items() if "error" in r]
    return report
