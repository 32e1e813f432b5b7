"""The LLM stage's requests and candidates for its offline measurements, and the stage built for them.

``candidate_source`` gives, per user, the request and the candidates the configured cascade hands the
LLM (the recall -> coarse cut, stale stages retrained first) or, without a coarse model, the most
popular unseen items; ``make_stage`` loads an ``LLMRerankStage`` with overrides of ``llm``. Shared by
``jobs.evaluation.llm_rerank_eval`` and the LLM benchmarks (``bench.llm_stage``,
``bench.llm_backbones``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from cascade.registry import build_pipeline, stage_context
from cascade.settings import Settings
from jobs.train import train_stages
from llm_rerank.stage import LLMRerankStage
from recsys.contract import Request


def candidate_source(split: Any, artifact_dir: Path, settings: Settings, phase: str = "valid"
                     ) -> tuple[Callable[[int, np.ndarray], tuple[Request, np.ndarray]], str]:
    """(``f(user_idx, history) -> (request, candidate items in order)``, where they come from).

    The recall -> coarse cut of the configured pipeline when ``<artifact_dir>/coarse`` exists
    (failing to train or load it raises), else the most popular items outside the history; the request excludes the history. Stages
    trained under another configuration or split are retrained first (``jobs.train.train_stages``,
    as ``recsys eval`` does): a stale coarse model behind the configured recall gives other
    candidates than the cascade serves (a probe on such artifacts once found the held item among
    the top 20 for 11% of users, against 33% on current ones).
    """
    pipeline, source = None, "popularity"
    if (artifact_dir / "coarse").exists():  # a failure to train or load them is an error, not popularity
        trained = train_stages(settings, artifact_dir, split, stages=("recall", "recall_holdout", "coarse"))
        pipeline = build_pipeline(settings, artifact_dir, only=("recall", "coarse"),
                                  phase=phase).without_budgets()  # type: ignore[arg-type]
        retrained = [k for k, v in trained.items() if not v.get("reused")]
        source = f"coarse (retrained stale {', '.join(retrained)})" if retrained else "coarse"
    by_pop = np.argsort(-split.item_popularity(phase), kind="stable")

    def candidates_for(user_idx: int, history: np.ndarray) -> tuple[Request, np.ndarray]:
        request = dataclasses.replace(split.request(user_idx, history, k=50), exclude=history)
        if pipeline is not None:
            return request, pipeline.run(request, until="coarse").candidates.items
        return request, by_pop[~np.isin(by_pop, history)]

    return candidates_for, source


def make_stage(settings: Settings, artifact_dir: Path, **llm: Any) -> Any:
    """An ``LLMRerankStage`` of ``llm`` (overrides of ``settings.llm``), loaded from ``artifact_dir``; its
    context (the KV cache's tier-2 client among it) follows the overridden section."""
    cfg = settings.llm.with_overrides(llm)
    stage = LLMRerankStage(None, cfg, **stage_context("llm", settings.model_copy(update={"llm": cfg})))
    stage.load(artifact_dir)
    return stage


def set_threads(threads: int | None) -> None:
    """torch's intra-op threads: ``threads``, else every core this process may run on."""
    import torch  # lazy: heavy (torch)

    torch.set_num_threads(threads or len(os.sched_getaffinity(0)))


def torch_threads() -> int:
    """torch's intra-op threads now (a report's cost figures depend on it)."""
    import torch  # lazy: heavy (torch)

    return int(torch.get_num_threads())
