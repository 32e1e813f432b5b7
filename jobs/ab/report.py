"""Markdown reports (plus their PNG plots) of the offline comparison and the online analysis.

``write_offline_report(report, out_dir)`` and ``write_online_report(report, out_dir)`` each
write ``README.md`` (offline) / ``online.md`` and the figures into ``out_dir`` and return the
Markdown path; the JSON reports stay the source of truth and the Markdown quotes them.

Deliberately left out: HTML, and judging the result (the reader decides what to ship).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jobs.ab.plots import plot_differences, plot_latency_cdf, plot_rates
from recsys.atomic import atomic_write_text


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join("" if v is None else str(v) for v in row) + " |" for row in rows]


def _ci(ci: Sequence[float] | None) -> str:
    return "" if not ci else f"[{ci[0]:+.5g}, {ci[1]:+.5g}]"


def _p(d: dict[str, Any]) -> str | None:
    """A p-value as reported; a bound (no bootstrap resample crossed 0) as ``< bound``."""
    p = d.get("p_value")
    return f"< {p:.2g}" if p is not None and d.get("p_value_is_bound") else p


def write_offline_report(report: dict[str, Any], out_dir: Path,
                         latencies_ms: dict[str, np.ndarray] | None = None) -> Path:
    out_dir = Path(out_dir)
    names = list(report["variants"])
    a, b = names
    lines = [f"# Offline A/B: {b} vs {a} on {report['dataset']}", "",
             f"{report['n_users']} test users ranked by both pipelines (leave-one-out, full catalog of "
             f"{report['n_items']} items, history excluded). Differences are `{report['difference_is']}` with "
             "paired bootstrap 95% CIs over users.", ""]
    for n in names:
        cfg = report["variants"][n].get("config")
        if cfg:
            lines.append(f"- **{n}**: `{cfg}`")
    warnings = report.get("warnings") or []
    lines += ([""] + [f"> **Warning**: {w}" for w in warnings]) if warnings else []
    metric_names = list(report["variants"][a]["metrics"])
    lines += ["", "## Metrics", ""]
    lines += _table(["metric", *names], [[m, *(report["variants"][n]["metrics"][m] for n in names)]
                                         for m in metric_names])
    lines += ["", "## Differences", ""]
    lines += _table(["metric", a, b, "diff", "95% CI", "p", "relative"],
                    [[m, d["a"], d["b"], f"{d['diff']:+.5g}", _ci(d.get("ci95")), _p(d),
                      None if d.get("relative") is None else f"{100 * d['relative']:+.2f}%"]
                     for m, d in report["differences"].items()])
    lists = {n: v["lists"] for n, v in report["variants"].items() if "lists" in v}
    if lists:
        lines += ["", "## Lists", ""]
        lines += _table(["variant", "users", "empty", "short", "complete", "short reasons"],
                        [[n, x["users"], x["empty"], x["short"], x["complete"], x["short_reasons"] or ""]
                         for n, x in lists.items()])
    lines += ["", "## Latency and LLM cost", ""]
    lines += _table(["variant", "p50 ms", "p95 ms", "p99 ms", "mean ms", "LLM calls", "prompt tokens",
                     "tokens/call"],
                    [[n, v["latency_ms"]["p50"], v["latency_ms"]["p95"], v["latency_ms"]["p99"], v["latency_ms"]["mean"],
                      v["llm"]["calls"], v["llm"]["prompt_tokens"], v["llm"]["tokens_per_call"]]
                     for n, v in report["variants"].items()])
    plot_differences(report["differences"], f"{b} - {a}", out_dir / "offline_differences.png")
    lines += ["", "![differences](offline_differences.png)"]
    if latencies_ms:
        plot_latency_cdf(latencies_ms, out_dir / "offline_latency_cdf.png")
        lines += ["", "![latency CDF](offline_latency_cdf.png)"]
    path = out_dir / "README.md"
    return atomic_write_text(path, "\n".join(lines) + "\n")


def write_online_report(report: dict[str, Any], out_dir: Path) -> Path:
    out_dir = Path(out_dir)
    lines = [f"# Online A/B analysis ({', '.join(report['experiments']) or 'no experiment name'})", "",
             f"{report['n_events']} events ({report['events_without_variant']} without a variant, left out); "
             f"control: **{report['control']}**.", ""]
    lines += [f"> **Warning**: {w}" for w in report["warnings"]] + ([""] if report["warnings"] else [])
    lines += _table(["arm", "impressions", "clicks", "CTR", "CTR 95% CI", "users", "converted", "conversion",
                     "conversion 95% CI"],
                    [[n, v["impressions"], v["clicks"], v["ctr"]["rate"], _ci(v["ctr"]["ci95"]), v["users_exposed"],
                      v["users_converted"], v["conversion"]["rate"], _ci(v["conversion"]["ci95"])]
                     for n, v in report["arms"].items()])
    lines += ["", f"## Against {report['control']}", ""]
    rows = []
    for arm, comp in report["comparisons"].items():
        for metric, c in comp.items():
            if c is not None:
                lift = None if c["relative_lift"] is None else f"{100 * c['relative_lift']:+.2f}%"
                rows.append([arm, metric, f"{c['diff']:+.5g}", _ci(c["ci95"]), c["z"], c["p_value"], lift])
    lines += _table(["arm", "metric", "diff", "95% CI", "z", "p", "lift"], rows)
    srm = report.get("srm")
    if srm is not None:
        lines += ["", "## Sample ratio", "",
                  f"Users per arm {srm['observed']} vs expected {({k: round(v, 1) for k, v in srm['expected'].items()})}: "
                  f"chi2 = {srm['chi2']:.3f} (df {srm['df']}), p = {srm['p_value']:.3g} "
                  f"-> {'**MISMATCH**' if srm['mismatch'] else 'no mismatch'} (threshold {srm['alpha']})."]
    plot_rates(report["arms"], out_dir / "online_rates.png")
    lines += ["", "![rates](online_rates.png)"]
    path = out_dir / "online.md"
    return atomic_write_text(path, "\n".join(lines) + "\n")
