"""``recsys bench llm-rerank``: the re-ranker's order against coarse's, paired per user, per backbone and mode.

The question a user of the LLM stage asks: over the candidates it would re-order (coarse's top
``candidates``), does the LLM's order put the user's held-out item higher than coarse's? Each
variant (a backbone, its scoring mode ``listwise``/``pointwise`` and the item text of the prompt,
``llm.item_text``) scores the same requests:

- **users**: a seeded random sample of ``users`` users of ``phase`` (the test item by default),
  history = everything before it, candidates = the configured recall -> coarse cut
  (``jobs.evaluation.llm_cases.candidate_source``). A user whose held item is not among the candidates
  scores the same NDCG@10 under any order of them, so only those whose item is among them
  reach the LLM; the others count with a difference of exactly zero. The report gives both
  (``held_in`` users, and the whole sample).
- **figures**: NDCG@10 and Recall@10 of coarse's order and of each variant's, over the whole
  sample; the paired-bootstrap 95% CI of variant minus coarse (over the whole sample and over the
  held-in users); the same per history-length slice; p50/p99 ms per request (a cold prefix: no
  KV cache) and the mean prompt tokens.
- ``partial(report)`` is called after each variant, so a long run killed later keeps the
  variants it finished.

The model is the base backbone zero-shot unless ``adapted`` (``<artifact_dir>/llm``).

Deliberately left out: fusing the LLM's order with coarse's (``bench.llm_backbones`` measures that,
and ``jobs.fusion_gate`` decides it for serving) and any training.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cascade.settings import Settings
from jobs.evaluation.llm_cases import candidate_source, make_stage, set_threads, torch_threads
from llm_rerank.backbone import resolve_model
from offline.bootstrap import paired_bootstrap
from offline.metrics import ndcg_at_ranks
from offline.split import Phase, Split
from recsys.progress import progress_bar

K = 10
HISTORY_SLICES = ((1, 5), (6, 20), (21, 10_000))  # as the eval report's short-history slices


@dataclass(frozen=True)
class Variant:
    """One re-ranker to measure: a backbone (packaged backbone name or directory), its scoring mode and item text."""

    model: str
    scoring: str = "listwise"
    item_text: str = "title_details"
    adapted: bool = False

    @property
    def name(self) -> str:
        return f"{self.model}/{self.scoring}/{self.item_text}{'/adapted' if self.adapted else ''}"


def parse_variant(text: str) -> Variant:
    """``model[/scoring[/item_text[/adapted]]]`` -> ``Variant``; ``ValueError`` naming the bad part.

    The options are read from the right, so the model may be a directory or a hub id with slashes.

    >>> parse_variant("smollm2-135m-instruct/pointwise/title")
    Variant(model='smollm2-135m-instruct', scoring='pointwise', item_text='title', adapted=False)
    >>> parse_variant("/models/qwen/listwise").model
    '/models/qwen'
    """
    parts = text.strip().rstrip("/").split("/")
    adapted = parts[-1] == "adapted"
    if adapted:
        parts.pop()
    item_text = parts.pop() if len(parts) > 1 and parts[-1] in ("title", "title_details") else None
    scoring = parts.pop() if len(parts) > 1 and parts[-1] in ("listwise", "pointwise") else None
    if (adapted or item_text) and scoring is None:
        raise ValueError(f"--variant {text!r}: name the scoring (listwise or pointwise) before the item text; "
                         "expected model[/listwise|pointwise[/title|title_details[/adapted]]]")
    model = "/".join(parts)
    if not model:
        raise ValueError(f"--variant {text!r}: expected model[/listwise|pointwise[/title|title_details[/adapted]]]")
    return Variant(model, scoring or "listwise", item_text or "title_details", adapted)


def held_rank(scores: np.ndarray, items: np.ndarray, held: int) -> int:
    """0-based rank of ``held`` when ``items`` are sorted by ``scores`` (ties: incoming order); -1 if absent.

    >>> held_rank(np.array([0.1, 0.9, 0.5]), np.array([7, 8, 9]), 9)
    1
    """
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    where = np.flatnonzero(np.asarray(items)[order] == held)
    return int(where[0]) if len(where) else -1


def paired(a: np.ndarray, b: np.ndarray, seed: int) -> dict[str, Any]:
    """Mean of ``b - a`` with its paired-bootstrap 95% CI (rounded for the report)."""
    if len(a) < 2:
        return {"mean": round(float(np.mean(b - a)) if len(a) else 0.0, 5), "ci95": None, "users": len(a)}
    boot = paired_bootstrap(a, b, n_boot=2000, seed=seed)
    return {"mean": round(boot["mean"], 5), "ci95": [round(x, 5) for x in boot["ci95"]], "users": len(a)}


def sample_cases(settings: Settings, artifact_dir: Path, split: Any, *, users: int, candidates: int, seed: int,
                 phase: Phase, progress: bool) -> tuple[list[tuple[Any, np.ndarray, int]], np.ndarray, str]:
    """(cases of the held-in users, [2, sampled users] array, where the candidates come from).

    Each case is (request, candidate items in coarse order, held item); the array's rows are the
    coarse rank of the held item (-1: not among the candidates) and the history length, per
    sampled user in the sample's order.
    """
    targets = split.targets(phase)
    pool = np.flatnonzero(targets >= 0)
    # the first ``users`` of one seeded permutation: a smaller sample is part of a larger one
    pick = np.sort(np.random.default_rng([seed, 0x11E]).permutation(pool)[:users])
    candidates_for, source = candidate_source(split, artifact_dir, settings, phase)
    cases, ranks, lengths = [], np.full(len(pick), -1, dtype=np.int64), np.zeros(len(pick), dtype=np.int64)
    for j, u in enumerate(progress_bar(pick, desc="coarse candidates", enabled=progress, unit="user")):
        history = split.history(int(u), phase)
        request, items = candidates_for(int(u), history)
        items = np.asarray(items[:candidates], dtype=np.int64)
        lengths[j] = len(history)
        ranks[j] = held_rank(-np.arange(len(items), dtype=np.float64), items, int(targets[u]))
        if ranks[j] >= 0:
            cases.append((request, items, int(targets[u])))
    return cases, np.stack([ranks, lengths]), source


def rerank_eval(settings: Settings, artifact_dir: Path, variants: Sequence[Variant], *, users: int = 2000,
                candidates: int | None = None, seed: int = 0, phase: Phase = "test", progress: bool = True,
                partial: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The whole comparison (see the module doc); returns the JSON report."""
    if not variants:
        raise ValueError("llm rerank eval: name at least one variant")
    n_cands = candidates or settings.llm.candidates
    split = Split.load(Path(artifact_dir) / "split")
    cases, (coarse_ranks, lengths), source = sample_cases(settings, Path(artifact_dir), split, users=users,
                                                          candidates=n_cands, seed=seed, phase=phase,
                                                          progress=progress)
    held_in = coarse_ranks >= 0
    coarse = ndcg_at_ranks(coarse_ranks, K)
    report: dict[str, Any] = {
        "dataset": split.name, "phase": phase, "candidates": n_cands, "candidates_from": source,
        "sample": {"users": len(coarse_ranks), "held_in_candidates": int(held_in.sum()), "seed": seed,
                   "of": int((split.targets(phase) >= 0).sum())},
        "coarse": {"ndcg@10": round(float(coarse.mean()), 5),
                   "recall@10": round(float(((coarse_ranks >= 0) & (coarse_ranks < K)).mean()), 5)},
        "variants": {}}
    for variant in variants:
        measured = measure_variant(settings, Path(artifact_dir), variant, cases, coarse_ranks, lengths, seed, progress)
        report["variants"][variant.name] = {"sample": report["sample"], "coarse": report["coarse"], **measured}
        if partial is not None:
            partial(report)
    return report


def merge_reports(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One report holding the variants of several runs (a slow backbone measured on a smaller sample:
    each variant keeps its own ``sample`` and ``coarse`` figures, against which its deltas are paired).

    Each variant keeps its run's ``provenance`` (as ``run_provenance``: the command that measured it).
    Runs of another dataset, phase or candidate count than the first are refused; a variant measured
    twice keeps the later run's figures.
    """
    if not reports:
        raise ValueError("llm rerank eval: no report to merge")
    keys = ("dataset", "phase", "candidates")
    first = {k: reports[0].get(k) for k in keys}
    merged: dict[str, Any] = {**first, "variants": {}}
    for r in reports:
        if "variants" not in r or any(k not in r for k in keys):
            raise ValueError("llm rerank eval: not an llm-rerank report (no 'variants', 'dataset', 'phase' "
                             "or 'candidates')")
        other = {k: r[k] for k in keys}
        if other != first:
            raise ValueError(f"llm rerank eval: cannot merge a run of {other} into one of {first}")
        for name, v in r["variants"].items():
            merged["variants"][name] = {"sample": r.get("sample"), "coarse": r.get("coarse"),
                                        "candidates_from": r.get("candidates_from"), **v,
                                        **({"run_provenance": r["provenance"]} if "provenance" in r else {})}
    return merged


def measure_variant(settings: Settings, artifact_dir: Path, variant: Variant, cases: Sequence[tuple[Any, np.ndarray, int]],
                    coarse_ranks: np.ndarray, lengths: np.ndarray, seed: int, progress: bool) -> dict[str, Any]:
    """One variant's figures against coarse's (the ranks of users outside ``cases`` stay as coarse's)."""
    model = resolve_model(settings.llm.with_overrides({"model": variant.model}), Path(settings.artifacts_dir))
    stage = make_stage(settings, artifact_dir, model=model, scoring=variant.scoring, item_text=variant.item_text,
                       use_adapted=variant.adapted, kv={"enabled": False}, batching={"enabled": False},
                       backend="local", candidates=max(len(c[1]) for c in cases) if cases else settings.llm.candidates)
    set_threads(settings.llm.threads)
    ranks = coarse_ranks.copy()
    held_idx = np.flatnonzero(coarse_ranks >= 0)
    ms, tokens = [], []
    for j, (request, items, held) in zip(held_idx, progress_bar(cases, desc=variant.name, enabled=progress,
                                                                 unit="user"), strict=True):
        parts = stage.build_prompt(request, items)
        tokens.append(len(parts.prefix) + sum(len(s) for s in parts.suffixes))
        t0 = time.perf_counter()
        scores = stage.score(request, items)
        ms.append((time.perf_counter() - t0) * 1000)
        ranks[j] = held_rank(scores, items, held)
    stage.close()
    base, ours = ndcg_at_ranks(coarse_ranks, K), ndcg_at_ranks(ranks, K)
    slices = {}
    for lo, hi in HISTORY_SLICES:
        rows = (lengths >= lo) & (lengths <= hi)
        if rows.any():
            slices[f"{lo}-{hi}" if hi < 10_000 else f"{lo}+"] = {
                "users": int(rows.sum()), "coarse_ndcg@10": round(float(base[rows].mean()), 5),
                "ndcg@10": round(float(ours[rows].mean()), 5), "vs_coarse": paired(base[rows], ours[rows], seed)}
    return {"model": stage.model_location, "scoring": variant.scoring, "item_text": variant.item_text,
            "adapted": variant.adapted, "precision": stage.precision,
            "ndcg@10": round(float(ours.mean()), 5),
            "recall@10": round(float(((ranks >= 0) & (ranks < K)).mean()), 5),
            "vs_coarse": paired(base, ours, seed),
            "vs_coarse_held_in": paired(base[held_idx], ours[held_idx], seed),
            "recall@10_vs_coarse": paired(((coarse_ranks >= 0) & (coarse_ranks < K)).astype(float),
                                          ((ranks >= 0) & (ranks < K)).astype(float), seed),
            "history_slices": slices,
            "cost_per_request": {"ms_p50": round(float(np.percentile(ms, 50)), 1) if ms else None,
                                 "ms_p99": round(float(np.percentile(ms, 99)), 1) if ms else None,
                                 "prompt_tokens_mean": round(float(np.mean(tokens)), 1) if tokens else None,
                                 "requests": len(ms), "threads": torch_threads()}}
