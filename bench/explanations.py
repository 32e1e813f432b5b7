"""Reasons for recommended items, measured.

``bench_explanations`` (``recsys bench explain``) serves sampled users through the loaded
``Recommender`` twice per ``explain_k`` (1 and 3): once without reasons and once with them, then
the same explain request again. It reports, per ``explain_k``:

- ``schema_valid_share``: generated rows that parse as the reason schema (target 100%);
- ``grounded_share``: generated rows whose reason passed the grounding check, before the fallback;
- ``template_share``: served reasons that came from the templates (failed check or budget);
- ``extra_ms_p50`` / ``extra_ms_p99``: an explain answer's time minus the same request's without;
- ``cache_hit_rate``: reasons served from the cache on the second request;
- ``within_budget_share``: explain requests whose reasons took no longer than ``llm.explain.budget_ms``
  (what a served request would have waited for: the rest get templates).

The benchmark lifts the request and explanation budgets (``--budget-ms``) so every generation
finishes and the check sees every reason; ``within_budget_share`` tells what the served budget
keeps. Twenty sampled reasons per run are kept in the report so a reader can judge them.

Deliberately left out: writing and checking reasons (``llm_rerank.explain``), precomputing them
(``jobs.explanations``).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cascade.settings import Settings
from llm_rerank.reason_cache import MemoryReasonCache
from offline.split import Split
from serving.schemas import RecommendRequest
from serving.service import Recommender

SAMPLED_REASONS = 20


def _settings_for_bench(settings: Settings, budget_ms: float) -> Settings:
    """``settings`` with request and explanation budgets of ``budget_ms`` (generation runs to the end)."""
    data = settings.model_dump(mode="json")
    data["pipeline"]["request_budget_ms"] = max(budget_ms, data["pipeline"]["request_budget_ms"])
    data["llm"]["explain"]["budget_ms"] = budget_ms
    return Settings.build(data)


def sample_users(split: Split, n: int, seed: int) -> list[str]:
    """``n`` users with a history, drawn with ``seed`` (every user when fewer)."""
    ids = [str(u) for u in split.vocab.user_ids]
    rng = random.Random(seed)
    return sorted(rng.sample(ids, min(n, len(ids))))


def _percentile(values: Sequence[float], q: float) -> float | None:
    return None if not values else round(float(np.percentile(values, q)), 1)


def bench_explanations(settings: Settings, artifact_dir: Path, *, users: int = 40, explain_ks: Sequence[int] = (1, 3),
                       k: int = 10, budget_ms: float = 60_000.0, seed: int = 0) -> dict[str, Any]:
    """The explanation benchmark on ``artifact_dir`` (module docstring); the report."""
    served_budget_ms = settings.llm.explain.budget_ms
    bench = _settings_for_bench(settings, budget_ms)
    rec = Recommender.load(bench, artifact_dir)
    rec.explanations.generator()
    rec.explanations.start_loading(wait=True)
    if rec.explanations.generator() is None:
        raise ValueError(f"no model writes reasons here: {rec.explanations.load_error or 'llm.explain.model'}")
    split = Split.load(Path(artifact_dir) / "split")
    chosen = sample_users(split, users, seed)
    runs = {str(ek): _run(rec, chosen, k, ek, served_budget_ms, seed) for ek in explain_ks}
    gen = rec.explanations.generator()
    return {"artifact_dir": str(artifact_dir), "backbone": rec.explanations.backbone(), "users": len(chosen), "k": k,
            "prompt_version": None if gen is None else gen.version(), "served_budget_ms": served_budget_ms,
            "runs": runs}


def _run(rec: Recommender, users: Sequence[str], k: int, explain_k: int, served_budget_ms: float,
         seed: int) -> dict[str, Any]:
    writer = rec.explanations.writer(rec.online)
    cache = writer.cache
    if isinstance(cache, MemoryReasonCache):  # the in-process cache; a Redis one is left as it is
        cache.clear()  # each explain_k starts cold
    before = Counter(writer.counts)
    extra, within, samples = [], 0, []
    for user in users:
        plain = _timed(rec, RecommendRequest(user_id=user, k=k))[0]
        took, answer = _timed(rec, RecommendRequest(user_id=user, k=k, explain=True, explain_k=explain_k))
        extra.append(took - plain)
        within += (took - plain) <= served_budget_ms
        samples += [{"user": user, "item": i.title, "reason": i.reason, "source": i.reason_source}
                    for i in answer.items if i.reason is not None]
    first = Counter(writer.counts) - before
    for user in users:  # the second request: reasons from the cache
        rec.respond(RecommendRequest(user_id=user, k=k, explain=True, explain_k=explain_k), log_impressions=False)
    second = Counter(writer.counts) - before - first
    generated = first["generated"]
    return {
        "requests": len(users),
        "reasons": first["served"],
        "schema_valid_share": _share(first["schema_valid"], generated),
        "grounded_share": _share(first["grounded"], generated),
        "template_share": _share(first["served"] - first["llm"], first["served"]),
        "extra_ms_p50": _percentile(extra, 50), "extra_ms_p99": _percentile(extra, 99),
        "within_budget_share": _share(within, len(users)),
        "cache_hit_rate": _share(second["cached"], second["served"]),
        "sampled_reasons": random.Random(seed).sample(samples, min(SAMPLED_REASONS, len(samples))),
    }


def _timed(rec: Recommender, body: RecommendRequest) -> tuple[float, Any]:
    t0 = time.perf_counter()
    answer = rec.respond(body, log_impressions=False)
    return (time.perf_counter() - t0) * 1000, answer


def _share(part: float, whole: float) -> float | None:
    return None if whole == 0 else round(part / whole, 4)
