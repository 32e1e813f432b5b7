"""Evaluates the whole cascade with the foundation's protocol and writes the eval report.

For every user, the configured pipeline answers one request built from the phase's input
history (``Split.history``); an observer captures what each stage handed on, so one pass
gives each stage's own top-10 ("recall", "coarse", "llm": the order that stage produced),
the fused "final" top-10 (after rules and fusion), candidate recall at each stage's depth,
and per-stage latencies. Differences between stages come with paired bootstrap 95% CIs.

Fusion weights are tuned on the *valid* phase (``jobs.fusion_gate.tune_fusion``); the test phase
is only ever read by ``evaluate_pipeline``.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np

from cascade.registry import build_pipeline, recall_config
from cascade.settings import Settings
from fusion.stage import (
    FUSED_STAGES,
    most_refined,
)
from jobs.evaluation.baselines import baseline_metrics, versus_best_baseline
from jobs.evaluation.cascade_run import (
    SCORED,
    K,
    inner_stage,
    list_completeness,
    llm_routing,
    memoised,
    requests_for,
    requests_for_user,
    run_cascade,
    slice_table,
)
from jobs.evaluation.cluster_run import per_user_pass
from jobs.evaluation.llm_sources import llm_sources
from offline.baselines import evaluate_rankings_per_user, popularity_rankings
from offline.bootstrap import MIN_USERS, paired_bootstrap
from offline.metrics import candidate_recall, coverage, summarize
from offline.split import Phase, Split
from recsys.config import POLICY_KINDS
from recsys.contract import ChannelRecall, PromptBuilding, ReloadableRules
from recsys.progress import progress_bar


def list_lengths(settings: Settings, artifact_dir: Path, split: Split, ks: list[int], phase: Phase = "test",
                 progress: bool = True) -> dict[str, Any]:
    """For each ``k``: every user's request through the served pipeline; complete, short and empty
    lists, why they are short, and how many served items came from backfill (``recsys bench lists``)."""
    pipeline = build_pipeline(settings, artifact_dir, phase=phase)
    out: dict[str, Any] = {"dataset": split.name, "phase": phase, "users": split.n_users, "k": {}}
    for k in ks:
        served, backfilled = np.zeros(split.n_users, dtype=np.int64), 0
        reasons: dict[str, int] = {}
        for req in progress_bar(requests_for(split, phase), desc=f"lists k={k}", enabled=progress, unit="user"):
            res = pipeline.run(dataclasses.replace(req, k=k))
            served[req.user_idx] = len(res.candidates)
            if res.short_reason:
                reasons[res.short_reason] = reasons.get(res.short_reason, 0) + 1
            backfilled += int(res.candidates.flags.get("backfill", np.zeros(0, dtype=bool)).sum())
        out["k"][str(k)] = {**list_completeness({"served": served, "short_reasons": reasons}, k),
                            "backfilled_items": backfilled}
    return out


HISTORY_SLICES = {"1-5": (1, 5), "6-20": (6, 20), ">20": (21, 10**9)}


def short_history(pipeline: Any, split: Split, phase: Phase, run: dict, *, min_users: int = 100,
                  sample: int = 300, seed: int = 0, n_boot: int = 2000, progress: bool = True) -> dict[str, Any]:
    """Every stage on test users sliced by the length of their input history (1-5, 6-20, > 20).

    A slice with at least ``min_users`` users of that history length is measured on them, from the
    main pass ``run``. A slice with fewer (a 5-core dataset has no user with 1-5 items) is built by
    truncation: up to ``sample`` users drawn (seeded) among those with a longer history, each sent
    as a user the trained models do not know (no user index, no attributes) whose history is only
    its last L items, L drawn uniformly within the slice; the target is unchanged. That is how a new
    user arrives at serving time. Left in: item-side statistics (co-visitation, popularity) were
    fitted on logs that include these users' full train sequences.

    Per slice and stage: NDCG@10, Recall@10, users, and the paired-bootstrap CI of each stage
    against the one before it (recall -> coarse -> llm -> final).
    """
    targets = split.targets(phase)
    length = np.array([len(split.history(u, phase)) for u in range(split.n_users)])
    rng = np.random.default_rng([seed, 0x5107])
    out: dict[str, Any] = {"min_users": min_users, "slices": {}}
    for name, (lo, hi) in HISTORY_SLICES.items():
        users = np.flatnonzero((length >= lo) & (length <= hi) & (targets >= 0))
        if len(users) >= min_users:
            tops, truncated = {s: run["tops"][s][users] for s in run["tops"]}, False
            ok = {s for s in run["tops"] if (run["tops"][s][users] >= 0).any()}
        else:
            pool = np.flatnonzero((length > hi) & (targets >= 0)) if hi < 10**9 else np.zeros(0, np.int64)
            if len(pool) == 0:
                out["slices"][name] = {"users": int(len(users)), "truncated": False,
                                       "skipped": f"{len(users)} users (< {min_users}) and none longer to truncate"}
                continue
            users = np.sort(rng.choice(pool, size=min(sample, len(pool)), replace=False))
            requests = []
            for u in users:
                keep = int(rng.integers(lo, min(hi, length[u]) + 1))
                hist = split.history(int(u), phase)[-keep:]
                requests.append(dataclasses.replace(
                    requests_for_user(split, int(u), phase), user_idx=None, user_attrs={}, history=hist,
                    exclude=hist, user_id=f"short-{name}-{u}", request_id=f"eval-short-{name}-{u}"))
            sub = run_cascade(pipeline, split, phase, progress=progress, requests=requests)
            tops, truncated = sub["tops"], True
            ok = {st for st, c in sub["status"].items() if c.get("ok", 0) > 0} | {"final"}
        stages = [s for s in (*SCORED, "final") if s in ok]
        row = {"users": int(len(users)), "truncated": truncated,
               **slice_table(tops, targets[users], stages, seed=seed, n_boot=n_boot)}
        out["slices"][name] = row
    return out


def _pct(values: list[float] | np.ndarray) -> dict[str, float]:
    v = np.asarray(values, dtype=np.float64)
    if len(v) == 0:
        return {}
    return {"p50": round(float(np.percentile(v, 50)), 3), "p99": round(float(np.percentile(v, 99)), 3),
            "mean": round(float(v.mean()), 3)}


def mean_ci95(values: np.ndarray, n_boot: int, seed: int) -> list[float]:
    """The percentile bootstrap 95% CI of the mean of per-user ``values`` (users resampled, as for the
    paired deltas: ``paired_bootstrap`` against zero)."""
    return [round(x, 5) for x in paired_bootstrap(np.zeros(len(values)), values, n_boot=n_boot, seed=seed)["ci95"]]


def require_bootstrap_users(split: Split) -> None:
    """Refuse a split with fewer users than the paired bootstrap needs (``offline.bootstrap.MIN_USERS``).

    Every eval report carries paired CIs over all the split's users (stage deltas, policy costs),
    so such a split cannot be evaluated. ``recsys eval`` calls this before it trains anything: a
    one-user dataset (``--k-core 1``) otherwise trains every stage and only then fails.
    """
    if split.n_users < MIN_USERS:
        raise ValueError(f"eval needs at least {MIN_USERS} users for its paired bootstrap confidence intervals; "
                         f"dataset {split.name!r} has {split.n_users}")


def stage_candidate_recall(settings: Settings, run: dict[str, Any], targets: np.ndarray,
                           users: np.ndarray | None = None) -> dict[str, float]:
    """Candidate recall of every scored stage that ran, keyed ``<stage>@<depth>`` (``recall@200``).

    The share of ``users`` (rows of ``run_cascade``'s ``run``; default: all of them) whose target
    is among what the stage handed on. The depth is the stage's configured one, else the longest
    list it handed on. A stage with no ``ok`` request is left out: the pipeline still shows a
    skipped (disabled) stage its input, which would read as its own candidates. The main report
    and the cold-item slices (``jobs.evaluation.cold_items``) both call this, so their keys agree.
    """
    depths = {s.name: s.depth for s in settings.pipeline.stages}
    ran = {name for name, st in run["status"].items() if st.get("ok", 0) > 0}
    rows = np.arange(len(targets)) if users is None else np.asarray(users, dtype=np.int64)
    out: dict[str, float] = {}
    for name in SCORED:
        if name not in ran:
            continue
        cands = run["candidates"][name]
        depth = depths.get(name) or len(max(cands, key=len))
        found = candidate_recall([cands[u] for u in rows], targets[rows]) if len(rows) else 0.0
        out[f"{name}@{depth}"] = round(found, 5)
    return out


def evaluate_pipeline(
    settings: Settings, artifact_dir: Path, split: Split, *, phase: Phase = "test", progress: bool = True,
    n_boot: int = 2000,
) -> dict[str, Any]:
    """Measure every stage on ``phase`` and return the eval report: per-stage metrics, candidate recall,
    coverage, paired deltas between stages, list completeness, rule and fusion costs, the LLM sources
    served (``jobs.evaluation.llm_sources``), timings."""
    require_bootstrap_users(split)
    t0 = time.perf_counter()
    pipeline = memoised(build_pipeline(settings, artifact_dir, phase=phase))  # policy passes replay the scorers
    load_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    run = per_user_pass(pipeline, settings, artifact_dir, split, phase, progress)  # on settings.ray when set
    eval_s = time.perf_counter() - t1
    targets = split.targets(phase)
    per_user, report_extra = _per_user_metrics(settings, split, phase, run, n_boot)
    ran = {name for name, st in run["status"].items() if st.get("ok", 0) > 0}
    stages = {name: {k: round(v, 5) for k, v in summarize(m).items()} for name, m in per_user.items()}
    stages_ci = {name: {metric: mean_ci95(m[metric], n_boot, settings.seed) for metric in (f"ndcg@{K}", f"recall@{K}")}
                 for name, m in per_user.items()}
    deltas = _stage_deltas(per_user, n_boot, settings.seed)
    cand_recall = stage_candidate_recall(settings, run, targets)
    report_extra.update(_diagnostics(settings, pipeline, split, phase, run, ran, deltas, n_boot, progress))
    t2 = time.perf_counter()
    costs, without_rules = policy_costs(pipeline, split, phase, per_user, n_boot=n_boot, seed=settings.seed)
    report_extra["policy_s"] = round(time.perf_counter() - t2, 2)
    if without_rules is not None:
        report_extra["baselines"]["without_rules"] = versus_best_baseline(
            {**per_user, "final_without_rules": without_rules}, [report_extra["baselines"]["best"]],
            "final_without_rules", K, n_boot=n_boot, seed=settings.seed)
    return {
        **report_extra,
        "dataset": split.name,
        "protocol": {**split.protocol, "phase": phase, "k": K},
        "n_users": split.n_users,
        "n_items": split.n_items,
        "stages": stages,
        "stages_ci95": stages_ci,
        "candidate_recall": cand_recall,
        "coverage": {name: round(coverage(run["tops"][name], split.n_items, K), 5)
                     for name in per_user if name in run["tops"]},
        "deltas": deltas,
        "lists": list_completeness(run),
        "policy_costs": costs,
        "stage_status": run["status"],
        "versions": pipeline.versions(),
        "llm_sources": llm_sources(settings, artifact_dir),  # what the training and the config switched on, and why
        "timings": {"load_s": round(load_s, 2), "eval_s": round(eval_s, 2),
                    "request_ms": _pct(run["total_ms"]),
                    "stage_ms": {name: _pct(v) for name, v in run["stage_ms"].items()},
                    "policy_s": report_extra.pop("policy_s")},
    }



def _per_user_metrics(settings: Settings, split: Split, phase: Phase, run: dict[str, Any], n_boot: int
                      ) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Any]]:
    """Per-user metrics of the baselines, every scored stage that ran and the final list; and the
    report's ``baselines`` section (the final list against the best of them)."""
    per_user = {"popularity": evaluate_rankings_per_user(split, popularity_rankings(split, phase, K), phase, K)}
    t_base = time.perf_counter()
    baselines = baseline_metrics(split, phase, K, recall_config(settings))
    per_user.update(baselines)
    baselines_s = time.perf_counter() - t_base
    ran = {name for name, st in run["status"].items() if st.get("ok", 0) > 0}
    for stage in (*SCORED, "final"):
        if stage == "final" or stage in ran:
            per_user[stage] = evaluate_rankings_per_user(split, run["tops"][stage], phase, K)
    section = {**versus_best_baseline(per_user, ["popularity", *baselines], "final", K, n_boot=n_boot,
                                      seed=settings.seed), "seconds": round(baselines_s, 2)}
    return per_user, {"baselines": section}


def _stage_deltas(per_user: dict[str, dict[str, np.ndarray]], n_boot: int, seed: int) -> dict[str, Any]:
    """Paired NDCG@10 deltas between consecutive stages (coarse vs recall, final and LLM vs coarse)."""

    def delta(a: str, b: str) -> dict[str, Any]:
        r = paired_bootstrap(per_user[a][f"ndcg@{K}"], per_user[b][f"ndcg@{K}"], n_boot=n_boot, seed=seed)
        return {f"ndcg@{K}": {"mean": round(r["mean"], 5), "ci95": [round(x, 5) for x in r["ci95"]],
                              "p_value": round(r["p_value"], 4)}}

    deltas = {}
    if "coarse" in per_user:
        deltas["coarse_vs_recall"] = delta("recall", "coarse")
        deltas["final_vs_coarse"] = delta("coarse", "final")
    if "llm" in per_user:
        deltas["llm_vs_coarse"] = delta("coarse", "llm")
    return deltas


def _diagnostics(settings: Settings, pipeline: Any, split: Split, phase: Phase, run: dict[str, Any], ran: set[str],
                 deltas: dict[str, Any], n_boot: int, progress: bool) -> dict[str, Any]:
    """The report's sections beyond the metrics: the LLM's cost and routing, per-channel candidate
    recall, the short-history slices."""
    out: dict[str, Any] = {}
    if "llm" in ran:
        out["llm_cost"] = llm_cost(pipeline, split, phase, run, settings.pipeline.stage("llm").depth)
    recall_stage = next((inner_stage(st) for spec, st in pipeline.stages if spec.enabled and spec.kind == "recall"),
                        None)
    if isinstance(recall_stage, ChannelRecall):
        from recall.extra_channels import channel_candidate_recall  # lazy: imports scipy

        out["channel_recall"] = channel_candidate_recall(recall_stage, split, phase)
    t3 = time.perf_counter()
    out["short_history"] = short_history(pipeline, split, phase, run, seed=settings.seed, n_boot=n_boot,
                                         progress=progress)
    out["short_history"]["seconds"] = round(time.perf_counter() - t3, 2)
    if "llm" in ran:
        all_users = {"users": int((split.targets(phase) >= 0).sum()),
                     "deltas": {"final_vs_coarse": deltas["final_vs_coarse"][f"ndcg@{K}"]}}
        out["llm_routing"] = llm_routing(out["short_history"]["slices"], {"all": all_users})
    return out


def policy_costs(pipeline: Any, split: Split, phase: Phase, per_user: dict[str, dict[str, np.ndarray]], *,
                 n_boot: int = 2000, seed: int = 0) -> tuple[dict[str, Any], dict[str, np.ndarray] | None]:
    """What each rule and the fusion cost the served list, with paired bootstrap CIs; and the
    per-user metrics of the final list with every rule off (None without a policy stage), against
    which the simple baselines, which no rule constrains, are also judged.

    Re-runs the cascade (scorers replayed, see ``memoised``) with one rule switched off at a
    time, with every rule off, and with every rule off and fusion replaced by the most refined
    scored stage's own order. ``decomposition`` splits final minus that stage's own top-10
    exactly into rules (all of them together), fusion, and the stage order itself; the per-rule
    deltas show which rule carries the rules' part (their sum differs from the total by the
    rules' interaction, reported as such).
    """
    metric = f"ndcg@{K}"
    policies = [st for spec, st in pipeline.stages if spec.enabled and spec.kind in POLICY_KINDS]
    fusions = [inner_stage(st) for spec, st in pipeline.stages if spec.enabled and spec.kind == "fusion"]
    base = per_user["final"][metric]
    ref = most_refined([s for s in FUSED_STAGES if s in per_user])

    def ci(new: np.ndarray, old: np.ndarray) -> dict[str, Any]:
        """Mean per-user ``new - old`` with its paired bootstrap 95% CI."""
        r = paired_bootstrap(old, new, n_boot=n_boot, seed=seed)
        return {"mean": round(r["mean"], 5), "ci95": [round(x, 5) for x in r["ci95"]]}

    def served_without(rule_ids: set[str] | None, fusion_off: bool = False) -> np.ndarray:
        return _served_without(pipeline, split, phase, policies, fusions, rule_ids, fusion_off)[metric]

    if not policies:
        return {"note": "no policy stage in this pipeline"}, None
    rules = policies[0] if isinstance(policies[0], ReloadableRules) else None
    active = rules.active if rules is not None else None
    rule_ids = [r.id for r in active.rules] if active is not None else []
    per_rule = {}
    for rid in rule_ids:
        per_rule[rid] = ci(served_without({rid}), base)  # cost = what switching it off gains back
    without_rules = _served_without(pipeline, split, phase, policies, fusions, None, False)
    no_rules = without_rules[metric]
    out: dict[str, Any] = {
        "metric": metric, "served": round(float(base.mean()), 5),
        "rules_in_force": rule_ids, "rules_skipped": dict(rules.skipped if rules is not None else {}),
        "per_rule": per_rule, "all_rules": ci(no_rules, base),
        "per_rule_sum": round(sum(v["mean"] for v in per_rule.values()), 5),
        "note": "each cost is (that variant - served): positive = the rule or fusion costs NDCG",
    }
    out["rules_interaction"] = round(out["all_rules"]["mean"] - out["per_rule_sum"], 5)
    if fusions and ref is not None:
        no_fusion = served_without(None, fusion_off=True)
        out["fusion_vs"] = ref
        out["fusion"] = ci(no_fusion, no_rules)
        stage_order = ci(per_user[ref][metric], no_fusion)
        out["decomposition"] = {
            "final_minus_" + ref: round(float(base.mean() - per_user[ref][metric].mean()), 5),
            "rules": -out["all_rules"]["mean"], "fusion": -out["fusion"]["mean"],
            "stage_order": -stage_order["mean"],
        }
    return out, without_rules



def _served_without(pipeline: Any, split: Split, phase: Phase, policies: list[Any], fusions: list[Any],
                    rule_ids: set[str] | None, fusion_off: bool) -> dict[str, np.ndarray]:
    """Per-user metrics of the final list with the rules ``rule_ids`` switched off (every rule when
    None) and, with ``fusion_off``, fusion serving the most refined stage's order; every stage is
    restored afterwards."""
    saved = [(st, st.ruleset) for st in policies]
    saved_w = [(st, st.config) for st in fusions]
    try:
        for st, rs in saved:
            keep = () if rule_ids is None else tuple(r for r in rs.rules if r.id not in rule_ids)
            st.use(rs.model_copy(update={"rules": keep}), st.items)
        if fusion_off:
            for st, cfg in saved_w:
                st.config = cfg.model_copy(update={"weights": None})
        run = run_cascade(pipeline, split, phase, progress=False)
    finally:
        for st, rs in saved:
            st.use(rs, st.items)
        for st, cfg in saved_w:
            st.config = cfg
    return evaluate_rankings_per_user(split, run["tops"]["final"], phase, K)


def llm_cost(pipeline: Any, split: Split, phase: Phase, run: dict, depth: int | None,
             sample: int = 200) -> dict[str, Any]:
    """Candidates per LLM call, prompt tokens per request (shared prefix counted once, as served
    with prefix reuse; measured on the first ``sample`` users) and the stage's latency."""
    stage = inner_stage(pipeline.stage("llm"))
    tokens = []
    for req in requests_for(split, phase)[:sample]:
        items = run["kept"]["llm"][req.user_idx].items
        if len(items) and isinstance(stage, PromptBuilding):
            parts = stage.build_prompt(req, items)
            tokens.append(len(parts.prefix) + sum(len(s) for s in parts.suffixes))
    ms = run["stage_ms"].get("llm", [])
    return {"candidates": depth, "calls": len(ms),
            "prompt_tokens_mean": round(float(np.mean(tokens)), 1) if tokens else None,
            "stage_ms_p50": _pct(ms).get("p50"), "stage_ms_p99": _pct(ms).get("p99")}
