"""What the Experiments page shows: the configured experiment and the latest stored analysis.

``recsys ab analyze --out FILE.json --report-dir DIR`` writes an analysis wherever it is told;
the console looks under the served artifact directory's ``ab/`` folder (``--out
<artifacts>/<dataset>/ab/online.json --report-dir <artifacts>/<dataset>/ab``), recursively,
and shows the newest JSON file (by modification time) that has the shape
``jobs.ab.analyze.analyze_events`` returns, with the ``online_*.png`` plots
``jobs.ab.report.write_online_report`` drew beside it. No such file: the page says so.

The experiment's ``salt`` is left out of the config view: with it anyone could compute which
arm any user falls in.

Deliberately left out: running analyses (that reads the whole event stream; it is a CLI job)
and offline comparisons (``recsys ab offline`` reports).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from recsys.experiments import ExperimentsConfig

ANALYSES_DIR = "ab"
ANALYSIS_KEYS = frozenset({"arms", "comparisons", "control", "srm"})
PLOT_NAME = re.compile(r"online_[A-Za-z0-9_.-]+\.png")
_MAX_FILES = 200  # newest first among at most this many JSON files: the folder is a report shelf


def experiment_view(cfg: ExperimentsConfig) -> dict[str, Any]:
    """The configured experiment as the page shows it: variants, shares, overrides; no salt."""
    return {
        "enabled": cfg.enabled, "name": cfg.name, "holdout": cfg.holdout, "control": cfg.control,
        "variants": [{"name": v.name, "share": v.share, "overrides": v.overrides.model_dump(exclude_none=True)}
                     for v in cfg.variants],
    }


def analyses_dir(artifact_dir: Path) -> Path:
    return Path(artifact_dir) / ANALYSES_DIR


def _read_analysis(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.keys() >= ANALYSIS_KEYS else None


def latest_analysis(artifact_dir: Path) -> dict[str, Any] | None:
    """``{"file", "modified", "report", "plots"}`` of the newest analysis under ``ab/``, else None.

    ``file`` is relative to the artifact directory; ``plots`` are the file names of the
    ``online_*.png`` figures in the analysis' folder (served by ``plot_path``).
    """
    root = analyses_dir(artifact_dir)
    if not root.is_dir():
        return None
    stamped = [(modified, path) for path in root.rglob("*.json") if (modified := _modified(path)) is not None]
    for modified, path in sorted(stamped, key=lambda pair: pair[0], reverse=True)[:_MAX_FILES]:
        report = _read_analysis(path)
        if report is not None:
            plots = sorted(p.name for p in path.parent.glob("online_*.png") if PLOT_NAME.fullmatch(p.name))
            return {"file": str(path.relative_to(artifact_dir)), "modified": modified, "report": report, "plots": plots}
    return None


def _modified(path: Path) -> float | None:
    """``path``'s mtime; None for an entry that cannot be read (a broken link, a file renamed away since the listing)."""
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def plot_path(artifact_dir: Path, name: str) -> Path | None:
    """The file of plot ``name`` of the latest analysis, or None (unknown names never reach the disk)."""
    if not PLOT_NAME.fullmatch(name):
        return None
    latest = latest_analysis(artifact_dir)
    if latest is None or name not in latest["plots"]:
        return None
    return Path(artifact_dir) / Path(latest["file"]).parent / name
