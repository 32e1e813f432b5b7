"""Offline A/B: two pipeline configs ranked on the same test users, differences with paired CIs.

Both pipelines answer every user's test request through ``jobs.evaluation.cascade_run.run_cascade``
(the foundation's protocol: leave-one-out, full catalog, history excluded), so the per-user
metrics pair up and ``offline.bootstrap.paired_bootstrap`` gives 95% CIs and p-values of
``B - A``. Per variant: NDCG@10, Recall@10, MRR@10, catalog coverage, intra-list diversity
on item categories (1 - Jaccard), novelty (self-information against the popularity visible
before the test items), request latency percentiles, and LLM cost: calls (requests where
the LLM stage ran or fell back after starting) and prompt tokens (prefix + every candidate
suffix, rebuilt with the stage's own prompt builder; 0 when no LLM stage runs).

Coverage is a catalog-level figure (not a per-user mean), so its difference has no CI.
Per variant, ``lists`` counts the users served an empty or short final list
(``jobs.evaluation.cascade_run.list_completeness``, as ``recsys eval`` reports it); a metric no user
defines is ``None``; a bootstrap p-value of 0 (no resample on the other side of 0) is
reported as the estimator's resolution ``2 / n_boot`` with ``p_value_is_bound: true``.

Before measuring, each variant's stages are checked as serving checks them: stages trained
on another split than the one measured refuse (``cascade.registry.StaleArtifacts``), and
recall/coarse stages whose recorded config differs from the variant's settings
(``cascade.registry.trained_under_other_settings``: B measured with stages trained under A's
settings) are named in ``warnings``; B may read its own artifact directory
(``artifact_dir_b``), which must hold the same split (``jobs.ab.split_check``: a refusal names
what differs, e.g. ``catalog listed vs interacted``).

Deliberately left out: Markdown and plots (``jobs.ab.report``, ``jobs.ab.plots``), and
multiple-comparison corrections across the metrics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cascade.registry import build_pipeline, check_trained_on_split, trained_under_other_settings
from cascade.settings import Settings
from jobs.ab.split_check import check_same_split
from jobs.evaluation.cascade_run import list_completeness, requests_for, run_cascade
from llm_rerank.stage import LLMRerankStage
from offline.baselines import evaluate_rankings_per_user
from offline.bootstrap import MIN_USERS, paired_bootstrap
from offline.metrics import PAD, coverage, intra_list_diversity, novelty
from offline.split import Phase, Split
from recsys.contract import PromptBuilding
from recsys.pipeline import Pipeline

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
        if not isinstance(stage, PromptBuilding) or calls == 0:
            continue
        n_cands = stage.cfg.candidates if isinstance(stage, LLMRerankStage) else None
        for req, kept in zip(requests_for(split, phase), run["kept"].get(spec.name, []), strict=False):
            if len(kept) == 0:
                continue
            parts = stage.build_prompt(req, kept.items[:n_cands])
            tokens += len(parts.prefix) + sum(len(s) for s in parts.suffixes)
    return {"calls": calls, "prompt_tokens": tokens, "tokens_per_call": round(tokens / calls, 1) if calls else 0.0}


def _latency(ms: np.ndarray) -> dict[str, float]:
    q = {f"p{p}": round(float(np.percentile(ms, p)), 3) for p in (50, 90, 95, 99)}
    return {**q, "mean": round(float(ms.mean()), 3), "max": round(float(ms.max()), 3)}


def _mean(values: np.ndarray) -> float | None:
    """Mean over the users that define the metric; None when none does (every list too short)."""
    defined = values[~np.isnan(values)]
    return round(float(defined.mean()), 5) if len(defined) else None


def measure_variant(pipeline: Any, split: Split, phase: Phase = "test", progress: bool = False) -> dict[str, Any]:
    """Run ``pipeline`` on every user; per-user metrics, the summary and the raw latencies."""
    run = run_cascade(pipeline, split, phase, progress)
    tops = run["tops"]["final"]
    per_user = {**evaluate_rankings_per_user(split, tops, phase, K),
                **per_user_beyond_accuracy(split, tops, phase), "latency_ms": run["total_ms"]}
    metrics = {name: _mean(v) for name, v in per_user.items() if name != "latency_ms"}
    metrics["coverage"] = round(coverage(tops, split.n_items, K), 5)
    return {
        "per_user": per_user,
        "summary": {"metrics": metrics, "latency_ms": _latency(run["total_ms"]),
                    "llm": llm_cost(pipeline, split, run, phase), "lists": list_completeness(run, K),
                    "stage_status": run["status"],
                    "versions": pipeline.versions()},
    }


def paired_differences(a: dict[str, np.ndarray], b: dict[str, np.ndarray], *, n_boot: int, seed: int) -> dict:
    """Per metric in ``PAIRED`` defined for >= ``MIN_USERS`` users in both: means, ``b - a`` with bootstrap
    CI and p-value (a p-value of 0 is the bound ``2 / n_boot``, flagged ``p_value_is_bound``), relative change."""
    out = {}
    for name in PAIRED:
        both = ~(np.isnan(a[name]) | np.isnan(b[name]))  # users where both variants define it
        if both.sum() < MIN_USERS:
            continue
        r = paired_bootstrap(a[name][both], b[name][both], n_boot=n_boot, seed=seed)
        mean_a = float(a[name][both].mean())
        bound = r["p_value"] == 0.0  # no resample crossed 0: p is below what n_boot resamples resolve
        out[name] = {"a": round(mean_a, 5), "b": round(float(b[name][both].mean()), 5),
                     "diff": round(r["mean"], 5), "ci95": [round(x, 5) for x in r["ci95"]],
                     "p_value": 2.0 / n_boot if bound else round(r["p_value"], 4), "p_value_is_bound": bound,
                     "n_users": int(both.sum()), "relative": None if mean_a == 0 else round(r["mean"] / mean_a, 5)}
    return out


def checked_pipeline(settings: Settings, artifact_dir: Path, name: str, phase: Phase = "test"
                     ) -> tuple[Pipeline, list[str]]:
    """The loaded pipeline of ``settings`` on ``artifact_dir`` and its warnings, after serving's checks:
    ``StaleArtifacts`` when a stage was trained on another split, a warning naming the recall/coarse
    stages trained under other settings than these (measured as trained)."""
    check_trained_on_split(build_pipeline(settings, artifact_dir, load=False), artifact_dir)  # before any load
    warnings = []
    if other := trained_under_other_settings(settings, artifact_dir):
        warnings.append(f"{name}: stage(s) {other} in {artifact_dir} were trained under other settings than "
                        f"{name}'s config (a recall depth, params or section, a coarse setting or its training "
                        f"revision, differs); they are measured as trained, not as {name} would train them: "
                        f"train {name}'s config into its own artifact directory (`recsys ab offline --artifacts-b`)")
    return build_pipeline(settings, artifact_dir, phase=phase), warnings


def list_warnings(name: str, lists: dict[str, Any]) -> list[str]:
    """A warning when some users of variant ``name`` got an empty or short final list."""
    if not lists["empty"] and not lists["short"]:
        return []
    return [f"{name}: {lists['empty']} of {lists['users']} users got an empty list and {lists['short']} a short "
            f"one (< {lists['k']} items; reasons {lists['short_reasons']}); see 'lists'"]


def compare_offline(
    settings_a: Settings, settings_b: Settings, artifact_dir: Path, split: Split, *, names: tuple[str, str] = ("A", "B"),
    phase: Phase = "test", n_boot: int = 2000, progress: bool = False, artifact_dir_b: Path | None = None,
) -> dict[str, Any]:
    """The offline A/B report of pipeline A vs B (built from the two settings) on ``phase``.

    ``split`` is the one saved in ``artifact_dir``; B reads ``artifact_dir_b`` (default ``artifact_dir``),
    which must hold the same split. Raises ``StaleArtifacts`` (a ``ValueError``) as serving does.
    """
    if names[0] == names[1]:
        raise ValueError(f"compare_offline: the two variants need distinct names, got {names}")
    art_a, art_b = Path(artifact_dir), Path(artifact_dir_b or artifact_dir)
    if art_b.resolve() != art_a.resolve():
        check_same_split(art_a, art_b)  # names what differs, e.g. catalog listed vs interacted
    pipelines, warnings = {}, []
    for name, settings, art in ((names[0], settings_a, art_a), (names[1], settings_b, art_b)):
        pipelines[name], stale = checked_pipeline(settings, art, name, phase)
        warnings += stale
    runs = {name: measure_variant(pipeline, split, phase, progress) for name, pipeline in pipelines.items()}
    a, b = (runs[n]["per_user"] for n in names)
    cov = {n: runs[n]["summary"]["metrics"]["coverage"] for n in names}
    differences = paired_differences(a, b, n_boot=n_boot, seed=settings_a.seed)
    for name in names:
        warnings += list_warnings(name, runs[name]["summary"]["lists"])
    if undefined := [m for m in PAIRED if m not in differences]:
        warnings.append(f"{undefined}: defined for fewer than {MIN_USERS} users in both variants (lists too short), "
                        "left out of 'differences'")
    return {
        "dataset": split.name,
        "protocol": {**split.protocol, "phase": phase, "k": K},
        "n_users": split.n_users,
        "n_items": split.n_items,
        "variants": {n: runs[n]["summary"] for n in names},
        "differences": {**differences,
                        "coverage": {"a": cov[names[0]], "b": cov[names[1]],
                                     "diff": round(cov[names[1]] - cov[names[0]], 5), "ci95": None,
                                     "p_value": None}},
        "difference_is": f"{names[1]} - {names[0]}",
        "warnings": warnings,
        "latencies_ms": {n: runs[n]["per_user"]["latency_ms"] for n in names},  # for the CDF plot
    }
