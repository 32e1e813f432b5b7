"""Offline A/B: two pipeline configs ranked on the same test users, differences with paired CIs.

Both pipelines answer every user's test request through ``jobs.cascade_run.run_cascade``
(the foundation's protocol: leave-one-out, full catalog, history excluded), so the per-user
metrics pair up and ``offline.bootstrap.paired_bootstrap`` gives 95% CIs and p-values of
``B - A``. Per variant: NDCG@10, Recall@10, MRR@10, catalog coverage, intra-list diversity
on item categories (1 - Jaccard), novelty (self-information against the popularity visible
before the test items), request latency percentiles, and LLM cost: calls (requests where
the LLM stage ran or fell back after starting) and prompt tokens (prefix + every candidate
suffix, rebuilt with the stage's own prompt builder; 0 when no LLM stage runs).

Coverage is a catalog-level figure (not a per-user mean), so its difference has no CI.

Deliberately left out: Markdown and plots (``jobs.ab.report``, ``jobs.ab.plots``), and
multiple-comparison corrections across the metrics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cascade.registry import build_pipeline
from cascade.settings import Settings
from jobs.cascade_run import requests_for, run_cascade
from offline.baselines import evaluate_rankings_per_user
from offline.bootstrap import paired_bootstrap
from offline.metrics import PAD, coverage, intra_list_diversity, novelty
from offline.split import Phase, Split

K = 10
PAIRED = (f"ndcg@{K}", f"recall@{K}", f"mrr@{K}", "intra_list_diversity", "novelty", "latency_ms")


def per_user_beyond_accuracy(split: Split, tops: np.ndarray, phase: Phase) -> dict[str, np.ndarray]:
    """Per-user intra-list diversity and novelty (NaN where a list is too short to define them)."""
    cats = [list(c) for c in split.items["categories"]]
    pop = split.item_popularity(phase)
    ild, nov = np.full(len(tops), np.nan), np.full(len(tops), np.nan)
    for u, row in enumerate(tops):
        items = row[row != PAD][:K]
        if len(items) >= 1:
            nov[u] = novelty(items[None, :], pop, k=K)
        if len(items) >= 2:  # re-index the list so the multi-hot matrix holds only its items
            ild[u] = intra_list_diversity(np.arange(len(items))[None, :], [cats[i] for i in items], k=K)
    return {"intra_list_diversity": ild, "novelty": nov}


def llm_cost(pipeline: Any, split: Split, run: dict[str, Any], phase: Phase) -> dict[str, Any]:
    """LLM calls and prompt tokens of one ``run_cascade`` run (zeros when no LLM stage ran)."""
    calls, tokens = 0, 0
    for spec, stage in pipeline.stages:
        if spec.kind != "llm" or not spec.enabled:
            continue
        status = run["status"].get(spec.name, {})
        calls += status.get("ok", 0) + status.get("fallback", 0)
        if not hasattr(stage, "build_prompt") or calls == 0:
            continue
        n_cands = getattr(getattr(stage, "cfg", None), "candidates", None)
        for req, kept in zip(requests_for(split, phase), run["kept"].get(spec.name, []), strict=False):
            if len(kept) == 0:
                continue
            parts = stage.build_prompt(req, kept.items[:n_cands])
            tokens += len(parts.prefix) + sum(len(s) for s in parts.suffixes)
    return {"calls": calls, "prompt_tokens": tokens, "tokens_per_call": round(tokens / calls, 1) if calls else 0.0}


def _latency(ms: np.ndarray) -> dict[str, float]:
    q = {f"p{p}": round(float(np.percentile(ms, p)), 3) for p in (50, 90, 95, 99)}
    return {**q, "mean": round(float(ms.mean()), 3), "max": round(float(ms.max()), 3)}


def measure_variant(pipeline: Any, split: Split, phase: Phase = "test", progress: bool = False) -> dict[str, Any]:
    """Run ``pipeline`` on every user; per-user metrics, the summary and the raw latencies."""
    run = run_cascade(pipeline, split, phase, progress)
    tops = run["tops"]["final"]
    per_user = {**evaluate_rankings_per_user(split, tops, phase, K),
                **per_user_beyond_accuracy(split, tops, phase), "latency_ms": run["total_ms"]}
    metrics = {name: round(float(np.nanmean(v)), 5) for name, v in per_user.items() if name != "latency_ms"}
    metrics["coverage"] = round(coverage(tops, split.n_items, K), 5)
    return {
        "per_user": per_user,
        "summary": {"metrics": metrics, "latency_ms": _latency(run["total_ms"]),
                    "llm": llm_cost(pipeline, split, run, phase), "stage_status": run["status"],
                    "versions": pipeline.versions()},
    }


def paired_differences(a: dict[str, np.ndarray], b: dict[str, np.ndarray], *, n_boot: int, seed: int) -> dict:
    """Per metric in ``PAIRED``: means, ``b - a`` with bootstrap CI and p-value, relative change."""
    out = {}
    for name in PAIRED:
        both = ~(np.isnan(a[name]) | np.isnan(b[name]))  # users where both variants define it
        if not both.any():
            continue
        r = paired_bootstrap(a[name][both], b[name][both], n_boot=n_boot, seed=seed)
        mean_a = float(a[name][both].mean())
        out[name] = {"a": round(mean_a, 5), "b": round(float(b[name][both].mean()), 5),
                     "diff": round(r["mean"], 5), "ci95": [round(x, 5) for x in r["ci95"]],
                     "p_value": round(r["p_value"], 4), "n_users": int(both.sum()),
                     "relative": None if mean_a == 0 else round(r["mean"] / mean_a, 5)}
    return out


def compare_offline(
    settings_a: Settings, settings_b: Settings, artifact_dir: Path, split: Split, *, names: tuple[str, str] = ("A", "B"),
    phase: Phase = "test", n_boot: int = 2000, progress: bool = False, artifact_dir_b: Path | None = None,
) -> dict[str, Any]:
    """The offline A/B report of pipeline A vs B (built from the two settings) on ``phase``."""
    if names[0] == names[1]:
        raise ValueError(f"compare_offline: the two variants need distinct names, got {names}")
    runs = {}
    for name, settings, art in ((names[0], settings_a, artifact_dir), (names[1], settings_b,
                                                                        artifact_dir_b or artifact_dir)):
        runs[name] = measure_variant(build_pipeline(settings, Path(art)), split, phase, progress)
    a, b = (runs[n]["per_user"] for n in names)
    cov = {n: runs[n]["summary"]["metrics"]["coverage"] for n in names}
    return {
        "dataset": split.name,
        "protocol": {**split.protocol, "phase": phase, "k": K},
        "n_users": split.n_users,
        "n_items": split.n_items,
        "variants": {n: runs[n]["summary"] for n in names},
        "differences": {**paired_differences(a, b, n_boot=n_boot, seed=settings_a.seed),
                        "coverage": {"a": cov[names[0]], "b": cov[names[1]],
                                     "diff": round(cov[names[1]] - cov[names[0]], 5), "ci95": None,
                                     "p_value": None}},
        "difference_is": f"{names[1]} - {names[0]}",
        "latencies_ms": {n: runs[n]["per_user"]["latency_ms"] for n in names},  # for the CDF plot
    }
