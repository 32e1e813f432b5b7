"""The short summary ``recsys eval`` prints; the full report goes to a JSON file.

An eval report holds every section a later question may need (per-stage latencies, rule and
fusion costs, short-history slices, versions): about a thousand lines of JSON, which is for
files and scripts. What a person reads after a run fits a screen: per stage NDCG@10 and
Recall@10 with their 95% CIs, candidate recall at each stage's depth, the paired deltas between
stages, the served order against the best baseline, how many users were evaluated and how many
the protocol left out, list completeness, the new-item slice, which LLM sources were on (and why
training switched the coarse ranker's on or off), and how many warnings there were.
For ``--seeds N`` the figures are the mean ± sd over the seeds.

Every section is optional: a report without one (an older report, a pipeline without a coarse
stage) gives a summary without that line. Deliberately left out: the latencies and the policy
costs (in the report), any figure the report does not hold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

STAGE_ORDER = ("popularity", "recall", "coarse", "llm", "final")


def summary(report: dict[str, Any], out: Path) -> str:
    """The summary of a ``recsys eval`` report (one run, or ``--seeds N``'s), ending with where
    the full report is."""
    lines = _seeds_lines(report) if "per_seed" in report else _run_lines(report)
    return "\n".join([*lines, f"full report: {out}"])


def _run_lines(report: dict[str, Any]) -> list[str]:
    protocol = report.get("protocol", {})
    lines = [_header(report.get("dataset"), protocol.get("phase"), report.get("n_users"), report.get("n_items")),
             _users_line(report.get("n_users"), protocol)]
    stages, cis = report.get("stages", {}), report.get("stages_ci95", {})
    if stages:
        k, w = protocol.get("k", 10), _width(stages)
        lines.append(f"{'':{w}}{f'NDCG@{k} [95% CI]':<27}Recall@{k} [95% CI]")
        for name in _ordered(stages):
            cells = [_with_ci(stages[name].get(f"{m}@{k}"), cis.get(name, {}).get(f"{m}@{k}")) for m in ("ndcg", "recall")]
            lines.append(f"{name:<{w}}{cells[0]:<27}{cells[1]}")
    if report.get("candidate_recall"):
        lines.append("candidate recall: " + ", ".join(f"{k} {v:.4f}" for k, v in report["candidate_recall"].items()))
    deltas = {name: d.get("ndcg@10") for name, d in report.get("deltas", {}).items() if d.get("ndcg@10")}
    if deltas:
        lines.append("NDCG@10 deltas (paired 95% CI): " + "; ".join(
            f"{name.replace('_vs_', ' vs ')} {_signed(d['mean'])} [{_signed(d['ci95'][0])}, {_signed(d['ci95'][1])}]"
            for name, d in deltas.items()))
    base = report.get("baselines", {})
    if base.get("best") and base.get("ndcg@10"):
        d = base["ndcg@10"]
        lines.append(f"{base.get('served', 'final')} vs the best baseline ({base['best']}): NDCG@10 {_signed(d['mean'])} "
                     f"[{_signed(d['ci95'][0])}, {_signed(d['ci95'][1])}], {base.get('verdict', '')}".rstrip(", "))
    if report.get("lists"):
        lines.append(_lists_line(report["lists"]))
    if report.get("cold_items"):
        lines.append(_cold_line(report["cold_items"]))
    if report.get("llm_sources"):
        lines.append(_llm_line(report["llm_sources"]))
    lines.append(_warnings_line(len(report.get("warnings", []))))
    return lines


def _seeds_lines(report: dict[str, Any]) -> list[str]:
    summary, per_seed = report.get("summary", {}), report.get("per_seed", {})
    seeds = report.get("seeds", list(per_seed))
    users = {r.get("lists", {}).get("users") for r in per_seed.values()} - {None}
    lines = [f"{report.get('dataset')}, {report.get('phase')} phase, {len(seeds)} seeds "
             f"({', '.join(str(s) for s in seeds)})" + (f": {users.pop()} users evaluated per seed" if len(users) == 1
                                                        else "")]
    stage_keys = {key.split(".")[1] for key in summary if key.startswith("stages.")}
    if stage_keys:
        w = _width(stage_keys)
        lines.append(f"{'':{w}}{'NDCG@10 mean ± sd':<22}Recall@10 mean ± sd")
        for name in _ordered(stage_keys):
            cells = [_mean_sd(summary.get(f"stages.{name}.{m}@10")) for m in ("ndcg", "recall")]
            lines.append(f"{name:<{w}}{cells[0]:<22}{cells[1]}")
    recall = {key.removeprefix("candidate_recall."): v for key, v in summary.items()
              if key.startswith("candidate_recall.")}
    if recall:
        lines.append("candidate recall: " + ", ".join(f"{k} {_mean_sd(v)}" for k, v in recall.items()))
    deltas = {key.split(".")[1]: v for key, v in summary.items()
              if key.startswith("deltas.") and key.endswith(".ndcg@10.mean")}
    if deltas:
        lines.append("NDCG@10 deltas (mean ± sd over seeds): " + "; ".join(
            f"{name.replace('_vs_', ' vs ')} {_signed(v['mean'])} ± {v['sd']:.4f}"
            + (" (beyond the sd)" if v.get("beyond_sd") else " (within the sd)") for name, v in deltas.items()))
    for seed, run in per_seed.items():
        if run.get("lists"):
            lines.append(f"seed {seed}: " + _lists_line(run["lists"]))
    lines.append(_warnings_line(sum(len(r.get("warnings", [])) for r in per_seed.values())))
    return lines


def _header(dataset: Any, phase: Any, n_users: Any, n_items: Any) -> str:
    sizes = ", ".join(x for x in (f"{n_users} users" if n_users is not None else "",
                                  f"{n_items} items" if n_items is not None else "") if x)
    return f"{dataset}, {phase} phase" + (f" ({sizes})" if sizes else "")


def _users_line(n_users: Any, protocol: dict[str, Any]) -> str:
    """Users evaluated (every user of the split has one held-out item) and those the protocol left out."""
    left = protocol.get("n_users_outside", protocol.get("n_users_dropped_short"))
    core = protocol.get("k_core")
    out = f"users: {n_users} evaluated"
    if left is not None:
        out += f", {left} left out by the {core}-core filter" if core else f", {left} left out"
    return out


def _lists_line(lists: dict[str, Any]) -> str:
    """``lists (k=10): 58 complete, 2 short, 0 empty of 60 users (short: ...)``"""
    reasons = lists.get("short_reasons") or {}
    why = f" (short: {'; '.join(f'{r} {n}' for r, n in reasons.items())})" if reasons else ""
    return (f"lists (k={lists.get('k')}): {lists.get('complete')} complete, {lists.get('short')} short, "
            f"{lists.get('empty')} empty of {lists.get('users')} users{why}")


def _cold_line(cold: dict[str, Any]) -> str:
    slices = cold.get("slices", {})
    parts = []
    for name, label in (("cold_item", "new-item targets"), ("warm_item", "the others")):
        s = slices.get(name, {})
        final = s.get("stages", {}).get("final", {}).get("ndcg@10")
        if final is not None:
            parts.append(f"{label} {final:.4f} on {s.get('users')} users")
    return (f"new items ({cold.get('new_items')} of {cold.get('of_items')} first seen after the cutoff): "
            f"final NDCG@10 {', '.join(parts) or 'not measured'}")


def _llm_line(sources: dict[str, Any]) -> str:
    """``LLM sources: coarse LLM embedding features off (why); re-ranker off; ...`` (``jobs.evaluation.llm_sources``)."""
    parts = [f"{name} LLM embedding features {'on' if c.get('chosen') else 'off'} ({c.get('why')})"
             for name, c in sources.get("coarse_llm_embedding_features", {}).items()]
    for key, label in (("llm_rerank", "re-ranker"), ("llm_recall_channel", "recall channel"),
                       ("llm_tag_rules", "tag rules")):
        if key in sources:
            parts.append(f"{label} {'on' if sources[key].get('on') else 'off'}")
    return "LLM sources: " + "; ".join(parts)


def _warnings_line(n: int) -> str:
    return "warnings: none" if n == 0 else f"warnings: {n} (each on stderr as 'warning: ...', and in the report)"


def _ordered(names: Any) -> list[str]:
    """Stages in cascade order (popularity first, final last), the baselines after popularity."""
    names = list(names)
    known = [n for n in STAGE_ORDER if n in names]
    others = [n for n in names if n not in STAGE_ORDER]
    return known[:1] + others + known[1:] if known and known[0] == "popularity" else others + known


def _width(names: Any) -> int:
    """The stage column's width: the longest name and two spaces."""
    return max(len(str(n)) for n in names) + 2


def _with_ci(value: float | None, ci: list[float] | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" + (f" [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "")


def _mean_sd(stat: dict[str, Any] | None) -> str:
    return "-" if not stat else f"{stat['mean']:.4f} ± {stat['sd']:.4f}"


def _signed(x: float) -> str:
    return f"{x:+.4f}"
