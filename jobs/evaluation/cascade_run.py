"""Running the cascade over many requests, and measuring what it handed on.

``run_cascade`` answers one request per user (or given requests) through a pipeline, keeping
each scored stage's own top-10, candidate sets, per-stage status and timings; ``memoised``
wraps the scoring stages so a second pass over the same requests (``jobs.evaluation.evaluate``'s
policy costs) replays their answers; ``slice_table`` turns a slice of users' top-10s into
NDCG/Recall per stage with paired CIs, and ``llm_routing`` reads from slice tables which
slices the LLM path lifts. Used by ``jobs.evaluation.evaluate``, ``jobs.evaluation.cold_items``
and the demo.

Deliberately left out: what is measured and reported (``jobs.evaluation.evaluate``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from offline.bootstrap import MIN_USERS, paired_bootstrap
from offline.metrics import per_user_metrics
from offline.split import Phase, Split
from recsys.config import POLICY_KINDS
from recsys.contract import Backfilling, Candidates, Request, Stage
from recsys.pipeline import Pipeline
from recsys.progress import progress_bar

K = 10
SCORED = ("recall", "coarse", "llm")  # stages whose own order is measured


def requests_for(split: Split, phase: Phase, k: int = K) -> list[Request]:
    return [requests_for_user(split, u, phase, k) for u in range(split.n_users)]


def requests_for_user(split: Split, u: int, phase: Phase, k: int = K) -> Request:
    return split.request(u, split.history(u, phase), k=k, request_id=f"eval-{phase}-{u}")


def run_cascade(pipeline: Any, split: Split, phase: Phase, progress: bool = True, until: str | None = None,
                requests: list[Request] | None = None) -> dict:
    """Run every user's request (or ``requests``: row i of each result is ``requests[i]``); return
    per-stage top-k rankings, candidate sets and timings. The pipeline runs without its budgets
    (``Pipeline.without_budgets``), so the rankings are the same on a busy machine as on a quiet one."""
    pipeline = pipeline.without_budgets()
    requests = requests_for(split, phase) if requests is None else requests
    n = len(requests)
    tops = {s: np.full((n, K), -1, dtype=np.int64) for s in (*SCORED, "final")}
    cands: dict[str, list[np.ndarray]] = {s: [np.zeros(0, np.int64)] * n for s in SCORED}
    kept: dict[str, list[Candidates]] = {s: [Candidates.empty()] * n for s in SCORED}
    ms: dict[str, list[float]] = {}
    status: dict[str, dict[str, int]] = {}
    total_ms = np.zeros(n)
    served = np.zeros(n, dtype=np.int64)  # items in each user's final list
    short_reasons: dict[str, int] = {}
    for u, req in enumerate(progress_bar(requests, desc=f"eval {phase}", enabled=progress, unit="user")):
        def observe(name: str, c: Candidates, u: int = u) -> None:
            if name in SCORED:
                cands[name][u] = c.items
                kept[name][u] = c

        t0 = time.perf_counter()
        res = pipeline.run(req, observe=observe, until=until)
        total_ms[u] = (time.perf_counter() - t0) * 1000
        for t in res.traces:
            status.setdefault(t.name, {}).setdefault(t.status, 0)
            status[t.name][t.status] += 1
            if t.status == "ok":
                ms.setdefault(t.name, []).append(t.ms)
            if t.name in SCORED and t.status == "ok":
                top = kept[t.name][u].sorted_by(t.name).items[:K]
                tops[t.name][u, : len(top)] = top
        final = res.candidates.items[:K]
        tops["final"][u, : len(final)] = final
        served[u] = len(final)
        if res.short_reason:
            short_reasons[res.short_reason] = short_reasons.get(res.short_reason, 0) + 1
    return {"tops": tops, "candidates": cands, "kept": kept, "stage_ms": ms, "status": status, "total_ms": total_ms,
            "served": served, "short_reasons": short_reasons}


def list_completeness(run: dict, k: int = K) -> dict[str, Any]:
    """How many users got an empty or short final list (fewer than ``k`` items), and why."""
    served = run["served"]
    n = len(served)
    empty, short = int((served == 0).sum()), int(((served > 0) & (served < k)).sum())
    return {"k": k, "users": n, "empty": empty, "short": short, "complete": n - empty - short,
            "empty_share": round(empty / n, 5) if n else 0.0, "short_reasons": run["short_reasons"]}


def slice_table(tops: dict[str, np.ndarray], targets: np.ndarray, stages: list[str], *, seed: int = 0,
                n_boot: int = 2000) -> dict[str, Any]:
    """NDCG@10 and Recall@10 of each stage's top-10 ``tops[stage]`` (rows = the slice's users) and the
    paired-bootstrap CI of each stage against the one before it in ``stages`` (and of final against
    coarse when a stage sits between them: the LLM path against the light path's order). A slice of
    fewer than ``offline.bootstrap.MIN_USERS`` users has its metrics and no deltas (no interval exists)."""
    if len(targets) == 0:
        return {"users": 0, "stages": {}, "deltas": {}}
    metrics = {s: per_user_metrics(tops[s], targets, K) for s in stages}
    out: dict[str, Any] = {"users": int(len(targets)), "stages": {
        s: {f"ndcg@{K}": round(float(m[f"ndcg@{K}"].mean()), 5), f"recall@{K}": round(float(m[f"recall@{K}"].mean()), 5)}
        for s, m in metrics.items()}, "deltas": {}}
    pairs = list(zip(stages, stages[1:], strict=False))
    if "coarse" in stages and "final" in stages and ("coarse", "final") not in pairs:
        pairs.append(("coarse", "final"))  # what the LLM path changes against the light path's ranking
    for before, after in pairs if len(targets) >= MIN_USERS else []:
        r = paired_bootstrap(metrics[before][f"ndcg@{K}"], metrics[after][f"ndcg@{K}"], n_boot=n_boot, seed=seed)
        out["deltas"][f"{after}_vs_{before}"] = {"mean": round(r["mean"], 5), "ci95": [round(x, 5) for x in r["ci95"]]}
    return out


def llm_routing(*slice_groups: dict[str, Any]) -> dict[str, Any]:
    """Which slices the LLM path should serve: those whose final NDCG@10 beats coarse's (the light
    path's order) with the whole paired 95% CI above zero; the evidence per slice. With none, the
    decision is to keep the hash share (``serving.llm_share``).

    >>> llm_routing({"1-5": {"users": 300, "deltas": {"final_vs_coarse": {"mean": 0.02, "ci95": [0.004, 0.03]}}},
    ...              "> 20": {"users": 800, "deltas": {"final_vs_coarse": {"mean": 0.0, "ci95": [-0.01, 0.01]}}}}
    ...             )["route_to_llm"]
    ['1-5']
    """
    evidence: dict[str, Any] = {}
    for group in slice_groups:
        for name, row in group.items():
            d = row.get("deltas", {}).get("final_vs_coarse")
            if d is not None:
                evidence[name] = {"users": row.get("users"), "final_vs_coarse": d}
    lifted = [name for name, e in evidence.items() if e["final_vs_coarse"]["ci95"][0] > 0]
    return {"rule": "route a slice to the LLM path when final - coarse NDCG@10 has its paired 95% CI above 0",
            "route_to_llm": lifted,
            "decision": f"LLM path for slices {lifted}" if lifted else
            "keep the hash share: the LLM path lifts no slice with a CI above zero",
            "evidence": evidence}


class _Replay:
    """Wraps a scoring stage so a second pass over the same requests replays its first answer.

    The policy-cost passes change only the rules and fusion, which run after the scorers, so
    replaying recall/coarse/LLM answers (keyed by request id and incoming items) gives the
    exact same inputs at a fraction of the cost. It is a ``Stage`` of its own: the pipeline never
    pins it (its answers are the first pass's); ``inner_stage`` gives the wrapped stage for its
    other capabilities.
    """

    def __init__(self, stage: Stage):
        self.wrapped = stage
        self.name, self.reads, self.writes = stage.name, stage.reads, stage.writes
        self._memo: dict[tuple[str, bytes], Candidates] = {}

    def load(self, artifact_dir: Any) -> None:
        self.wrapped.load(artifact_dir)

    def version(self) -> str:
        return self.wrapped.version()

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        key = (request.request_id, candidates.items.tobytes())
        if key not in self._memo:
            self._memo[key] = self.wrapped.run(request, candidates)
        return self._memo[key]


class _BackfillingReplay(_Replay):
    """A replayed stage that hands out candidates beyond its depth as the wrapped one does."""

    def __init__(self, stage: Stage):
        super().__init__(stage)
        if not isinstance(stage, Backfilling):
            raise TypeError(f"stage {stage.name!r} hands out no candidates beyond its depth")
        self._backfill = stage

    def more(self, request: Request, size: int) -> Iterator[np.ndarray]:
        return self._backfill.more(request, size)


def inner_stage(stage: Any) -> Any:
    """The stage a pipeline entry runs: the wrapped one of a replayed stage (``memoised``), else itself."""
    return stage.wrapped if isinstance(stage, _Replay) else stage


def memoised(pipeline: Any) -> Any:
    """``pipeline`` with every stage before the first policy stage wrapped in ``_Replay``."""
    stages, before_policy = [], True
    for spec, stage in pipeline.stages:
        before_policy = before_policy and spec.kind not in POLICY_KINDS
        replay = _BackfillingReplay if isinstance(stage, Backfilling) else _Replay
        stages.append((spec, replay(stage) if before_policy and spec.enabled else stage))
    return Pipeline(stages, request_budget_ms=pipeline.request_budget_ms)
