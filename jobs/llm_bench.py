"""Latency benchmark and batch scoring helpers for the CLI (``recsys bench llm``) and the evaluator.

``bench_llm_stage`` times the stage one request at a time with a cold prefix cache (the
worst case a new user sees): 20 candidates, the user's real history and attributes.
``score_requests`` scores many requests with a loaded stage for offline evaluation.

Deliberately left out: writing reports (``recsys bench llm`` does), metrics (``offline.metrics``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cascade.registry import stage_context
from cascade.settings import Settings
from llm_rerank.backends import LocalBackend
from llm_rerank.stage import LLMRerankStage
from recsys.contract import Candidates, Request


def score_requests(stage: Any, requests: Sequence[Request], candidates_list: Sequence[Candidates]) -> list[np.ndarray]:
    """Per request, the stage's LLM score for each candidate in its given order.

    Only the first ``stage.cfg.candidates`` rows are scored; later rows get NaN.
    """
    if len(requests) != len(candidates_list):
        raise ValueError(f"score_requests: {len(requests)} requests but {len(candidates_list)} candidate sets")
    out = []
    for request, cands in zip(requests, candidates_list, strict=True):
        scores = np.full(len(cands), np.nan, dtype=np.float32)
        n = min(stage.cfg.candidates, len(cands))
        scores[:n] = stage.score(request, cands.items[:n])
        out.append(scores)
    return out


def bench_llm_stage(artifact_dir: Path | str, split: Any, n_requests: int = 20, candidates: int = 20,
                    settings: Settings | None = None, stage: Any = None, seed: int = 0) -> dict[str, float]:
    """Stage latency for ``candidates`` candidates, one request at a time, cold prefix.

    Candidates are the most popular items outside the user's history (a realistic coarse
    list). Pass ``stage`` to bench an already loaded one; else it is built from ``settings``
    (default ``Settings()``) and loaded from ``artifact_dir``.
    """
    if stage is None:
        settings = settings or Settings()
        stage = LLMRerankStage(None, settings.llm.with_overrides({"candidates": candidates}),
                               **stage_context("llm", settings))
        stage.load(artifact_dir)
    rng = np.random.default_rng(seed)
    users = rng.choice(split.n_users, size=min(n_requests, split.n_users), replace=False)
    by_pop = np.argsort(-split.item_popularity("valid"), kind="stable")
    stage.score(split.request(int(users[0]), split.history(int(users[0]), "valid"), k=10),
                by_pop[:candidates])  # warm-up: first call pays one-off allocation costs
    # cold prefix: the in-process caches are cleared per request (an http server's cache is out of reach)
    local = stage.backend if isinstance(stage.backend, LocalBackend) else None
    ms, tokens = [], []
    for u in users:
        history = split.history(int(u), "valid")
        items = by_pop[~np.isin(by_pop, history)][:candidates]
        request = split.request(int(u), history, k=10)
        if local is not None:
            local.clear_prefix_caches()
        parts = stage.build_prompt(request, items)
        t0 = time.perf_counter()
        stage.run(request, Candidates(items=items, scores={"coarse": -np.arange(len(items), dtype=np.float32)}))
        ms.append((time.perf_counter() - t0) * 1000)
        tokens.append(len(parts.prefix) + sum(len(s) for s in parts.suffixes))
    return {"stage_ms_p50": float(np.percentile(ms, 50)), "stage_ms_p99": float(np.percentile(ms, 99)),
            "prompt_tokens_mean": float(np.mean(tokens)), "candidates": float(candidates),
            "requests": float(len(ms)), "scoring": stage.cfg.scoring}
