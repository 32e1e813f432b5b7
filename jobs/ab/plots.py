"""PNG plots of the A/B reports, drawn with matplotlib's Agg backend (no display needed).

- ``plot_differences``: each paired metric's ``B - A`` as a share of A's mean, with its 95%
  CI as error bars (metrics live on different scales; relative changes share one axis);
- ``plot_latency_cdf``: the empirical CDF of request latency per variant (log x axis);
- ``plot_rates``: online CTR and conversion per arm with Wilson 95% intervals.

Figures are small (about 6 x 3.5 inches at 80 dpi, well under 200 KB). Deliberately left
out: styling beyond what reads clearly in a Markdown report.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

_DPI = 80


def _pyplot() -> Any:
    import matplotlib  # lazy: heavy (matplotlib), only when a report is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after matplotlib.use("Agg"), which must come first

    return plt


def plot_differences(differences: Mapping[str, Mapping[str, Any]], label: str, path: Path) -> Path:
    """Relative difference (%) with CI per metric that has one."""
    plt = _pyplot()
    rows = [(name, d) for name, d in differences.items() if d.get("ci95") and d.get("a")]
    names = [n for n, _ in rows]
    rel = np.array([100 * d["diff"] / d["a"] for _, d in rows])
    lo = np.array([100 * d["ci95"][0] / d["a"] for _, d in rows])
    hi = np.array([100 * d["ci95"][1] / d["a"] for _, d in rows])
    fig, ax = plt.subplots(figsize=(6, 0.5 + 0.45 * max(len(rows), 1)))
    y = np.arange(len(rows))
    ax.errorbar(rel, y, xerr=[rel - lo, hi - rel], fmt="o", capsize=4, color="tab:blue")
    ax.axvline(0, color="grey", lw=1, ls="--")
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlabel(f"{label}, % of A's mean (95% paired bootstrap CI)")
    fig.tight_layout()
    return _save(fig, path)


def plot_latency_cdf(latencies: Mapping[str, np.ndarray], path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, ms in latencies.items():
        v = np.sort(np.asarray(ms, dtype=np.float64))
        ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=f"{name} (p50 {np.median(v):.1f} ms)")
    ax.set_xscale("log")
    ax.set_xlabel("request latency (ms, log scale)")
    ax.set_ylabel("share of requests")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    return _save(fig, path)


def plot_rates(arms: Mapping[str, Mapping[str, Any]], path: Path) -> Path:
    """CTR and conversion per arm with their Wilson intervals, side by side."""
    plt = _pyplot()
    names = list(arms)
    fig, axes = plt.subplots(1, 2, figsize=(7, 3.2))
    for ax, metric in zip(axes, ("ctr", "conversion"), strict=True):
        rate = np.array([arms[n][metric]["rate"] or 0.0 for n in names])
        cis = [arms[n][metric]["ci95"] or (r, r) for n, r in zip(names, rate, strict=True)]  # None: no rate
        lo, hi = np.array([ci[0] for ci in cis]), np.array([ci[1] for ci in cis])
        ax.bar(names, rate, color="tab:blue", alpha=0.6)
        ax.errorbar(names, rate, yerr=[np.maximum(rate - lo, 0), np.maximum(hi - rate, 0)], fmt="none",
                    capsize=5, color="black")
        ax.set_title(f"{metric} (Wilson 95% CI)")
    fig.tight_layout()
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=_DPI)
    _pyplot().close(fig)
    return path
