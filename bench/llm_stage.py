"""``recsys bench llm``: precision, prefix KV cache and dynamic batching, each side by side in one run.

Requests are real ML-100K validation users (history = their train sequence, attributes from
the users table) with their real coarse candidates when ``<artifact_dir>/coarse`` exists (the
recall -> coarse cut of the configured pipeline), else the most popular unseen items.

- precision: the same requests through fp32, bf16 and int8 (SmoothQuant W8A8 calibrated on
  prompts of other users, saved in ``work_dir``); per precision stage latency, prompt tokens/s,
  top-10 overlap and Spearman against fp32, NDCG@10 of the LLM order against the held-out item.
- prefix_cache: cold (empty caches), warm (tier-1 hit), tier-2 (tier 1 cleared: what another
  worker or a restarted one sees), and a shared-prefix request (same user, other candidates);
  max |score - uncached score| in fp32 (exactness) and bf16.
- batching: ``concurrency`` client threads, bf16, batched stage vs the same stage serialised.

Deliberately left out: the report file (the CLI writes it) and any GPU path (docs/vllm.md).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from cascade.settings import Settings
from jobs.evaluation.llm_cases import candidate_source, make_stage, set_threads, torch_threads
from llm_rerank.backbone import resolve_model
from offline.metrics import PAD, per_user_metrics
from offline.split import Split
from recsys.contract import Request
from recsys.redis_server import EmbeddedRedis

log = logging.getLogger(__name__)
Case = tuple[Request, np.ndarray, int]  # request, candidate item_idx (coarse order), held-out item


def bench_requests(split: Any, artifact_dir: Path, settings: Settings, n: int, candidates: int, seed: int,
                   phase: str = "valid") -> tuple[list[Case], str]:
    """``n`` validation users with their coarse (or popularity) candidates; returns (cases, source)."""
    rng = np.random.default_rng(seed)
    users = rng.choice(split.n_users, size=min(n, split.n_users), replace=False)
    targets = split.targets(phase)
    candidates_for, source = candidate_source(split, artifact_dir, settings, phase)
    cases = []
    for u in users:
        request, items = candidates_for(int(u), split.history(int(u), phase))
        cases.append((dataclasses.replace(request, k=candidates), np.asarray(items[:candidates]), int(targets[u])))
    return cases, source


def ensure_calibrated(settings: Settings, artifact_dir: Path, out_dir: Path, cases: Sequence[Case],
                      alpha: float) -> dict[str, Any]:
    """SmoothQuant-calibrate the fp32 serving model on the prompts of ``cases`` into ``out_dir``
    (reused when a calibration with the same alpha is there)."""
    from llm_rerank.quant import CALIBRATION_FILE, calibrate, save_calibrated  # lazy: imports torch

    fp32 = make_stage(settings, artifact_dir, precision="fp32")
    if (out_dir / CALIBRATION_FILE).exists():
        record = json.loads((out_dir / CALIBRATION_FILE).read_text())
        if record.get("alpha") == alpha and record.get("source") == fp32.model_location:
            return {**record, "reused": True}
    prompts = []
    for request, items, _ in cases:
        parts = fp32.build_prompt(request, items)
        prompts += [parts.prefix + s for s in parts.suffixes]
    model = fp32.local().model
    record = calibrate(model, prompts, alpha)
    save_calibrated(model, fp32.prompts.tok, record, out_dir, source=fp32.model_location)
    return record


def bench_llm(settings: Settings, artifact_dir: Path, work_dir: Path, *, requests: int = 30, calib_requests: int = 32,
              concurrency: int = 8, batch_requests: int = 32, alpha: float = 0.5, block_tokens: int = 16,
              sections: Sequence[str] = ("precision", "prefix_cache", "batching"), seed: int = 0,
              on_section: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The whole report (see the module docstring); ``work_dir`` receives the int8 calibration.

    ``on_section(report_so_far)`` runs after each section (the CLI saves partial results).
    """
    done = on_section or (lambda _report: None)
    split = Split.load(artifact_dir / "split")
    # pin the served model once, so every precision and section measures the same weights even if
    # a training job replaces <artifact_dir>/llm during the run
    location = _serving_location(settings, artifact_dir)
    settings = settings.model_copy(update={"llm": settings.llm.with_overrides(
        {"model": location, "use_adapted": False})})
    n = max(requests, batch_requests)
    cases, source = bench_requests(split, artifact_dir, settings, n + calib_requests, settings.llm.candidates, seed)
    calib, cases = cases[n:], cases[:n]  # calibration prompts come from other users
    set_threads(settings.llm.threads)  # faiss in recall may have set OpenMP (and so torch) to 1 thread
    report: dict[str, Any] = {"dataset": artifact_dir.name, "candidates_from": source, "requests": requests,
                              "candidates": settings.llm.candidates, "scoring": settings.llm.scoring,
                              "model": location,
                              "threads": torch_threads()}
    t0 = time.perf_counter()
    if "precision" in sections:
        report["precision"] = bench_precisions(settings, artifact_dir, cases[:requests], work_dir / "llm_w8a8",
                                               calib, alpha)
        done(report)
    if "prefix_cache" in sections:
        server = EmbeddedRedis(work_dir / "redis")
        url = server.start()
        try:
            report["prefix_cache"] = bench_prefix_cache(settings, artifact_dir, cases[:requests], url, "fp32",
                                                        block_tokens)
            report["prefix_cache"]["bf16"] = bench_prefix_cache(settings, artifact_dir, cases[:requests], url,
                                                                "bf16", block_tokens)
        finally:
            server.stop()
        done(report)
    if "batching" in sections:
        report["batching"] = bench_batching(settings, artifact_dir, cases[:batch_requests], concurrency, "bf16")
    report["seconds"] = time.perf_counter() - t0
    return report


def _serving_location(settings: Settings, artifact_dir: Path) -> str:
    adapted = artifact_dir / "llm"
    if settings.llm.use_adapted and (adapted / "config.json").exists():
        return str(adapted)
    return resolve_model(settings.llm, Path(settings.artifacts_dir))


def _ranking_metrics(scores: Sequence[np.ndarray], ref: Sequence[np.ndarray], cases: Sequence[Case]) -> dict:
    from scipy.stats import spearmanr  # lazy: imports scipy

    overlap, rho = [], []
    ranking = np.full((len(cases), 10), PAD, dtype=np.int64)
    for row, (s, r, (_, items, _target)) in enumerate(zip(scores, ref, cases, strict=True)):
        top, top_ref = np.argsort(-s, kind="stable")[:10], np.argsort(-r, kind="stable")[:10]
        overlap.append(len(set(top) & set(top_ref)) / len(top_ref))
        rho.append(float(spearmanr(s, r).statistic) if np.ptp(r) > 0 and np.ptp(s) > 0 else 1.0)
        order = items[top]
        ranking[row, : len(order)] = order
    ndcg = per_user_metrics(ranking, np.array([int(c[2]) for c in cases], dtype=np.int64), 10)["ndcg@10"]
    return {"top10_overlap_vs_fp32": float(np.mean(overlap)), "spearman_vs_fp32": float(np.mean(rho)),
            "ndcg@10": float(np.mean(ndcg))}


def _summary(ms: Sequence[float]) -> dict[str, float]:
    return {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99))}


def bench_precisions(settings: Settings, artifact_dir: Path, cases: Sequence[Case], int8_dir: Path,
                     calib: Sequence[Case], alpha: float) -> dict[str, Any]:
    """The same requests through fp32, bf16 and int8, interleaved request by request.

    Each request runs once per precision, in an order rotated per request, so a slow spell of a
    shared machine (another process, frequency changes) falls on every precision alike instead
    of on whichever ran during it.
    """
    calibration = ensure_calibrated(settings, artifact_dir, int8_dir, calib, alpha)
    precisions = ("fp32", "bf16", "int8")
    stages = {p: make_stage(settings, artifact_dir, precision=p, int8_dir=int8_dir, prefix_cache_size=0)
              for p in precisions}
    for stage in stages.values():
        stage.score(cases[0][0], cases[0][1])  # warm-up: one-off allocations
    ms: dict[str, list[float]] = {p: [] for p in precisions}
    scores: dict[str, list[np.ndarray]] = {p: [] for p in precisions}
    tokens = 0
    for n, (request, items, _) in enumerate(cases):
        parts = stages["fp32"].build_prompt(request, items)
        tokens += len(parts.prefix) + sum(len(s) for s in parts.suffixes)
        for p in precisions[n % 3:] + precisions[: n % 3]:
            t0 = time.perf_counter()
            scores[p].append(stages[p].score(request, items))
            ms[p].append((time.perf_counter() - t0) * 1000)
    out: dict[str, Any] = {}
    for p in precisions:
        s = _summary(ms[p])
        out[p] = {"stage_ms_p50": s["p50"], "stage_ms_p99": s["p99"],
                  "tokens_per_s": tokens / (sum(ms[p]) / 1000), **_ranking_metrics(scores[p], scores["fp32"], cases)}
    out["int8_speedup_vs_bf16"] = out["bf16"]["stage_ms_p50"] / out["int8"]["stage_ms_p50"]
    out["int8_calibration"] = {k: calibration[k] for k in ("alpha", "prompts", "tokens") if k in calibration}
    out["int8_calibration"]["rest_dtype"] = str(stages["int8"].local().model.dtype).removeprefix("torch.")
    return out


def bench_prefix_cache(settings: Settings, artifact_dir: Path, cases: Sequence[Case], redis_url: str,
                       precision: str, block_tokens: int) -> dict[str, Any]:
    kv = {"enabled": True, "tier2": True, "tier2_url": redis_url, "block_tokens": block_tokens,
          "tier2_prefix": f"bench-{precision}:"}
    cached = make_stage(settings, artifact_dir, precision=precision, kv=kv)
    blocks = cached.local().blocks
    plain = make_stage(settings, artifact_dir, precision=precision, prefix_cache_size=0)
    phases: dict[str, list[float]] = {"uncached": [], "cold": [], "warm": [], "tier2": [], "shared_prefix": []}
    diffs: list[float] = []
    plain.score(cases[0][0], cases[0][1])
    for request, items, _ in cases:
        t0 = time.perf_counter()
        ref = plain.score(request, items)
        phases["uncached"].append((time.perf_counter() - t0) * 1000)
        for phase, cands in (("cold", items), ("warm", items), ("tier2", items), ("shared_prefix", items[::-1])):
            if phase == "tier2":
                blocks.cache.clear_tier1()
            t0 = time.perf_counter()
            got = cached.score(request, cands)
            phases[phase].append((time.perf_counter() - t0) * 1000)
            if phase != "shared_prefix":
                diffs.append(float(np.max(np.abs(got - ref))))
    stats = blocks.stats()
    out = {f"{p}_ms_p50": _summary(v)["p50"] for p, v in phases.items()}
    out.update({"hit_rate": stats["hit_rate"], "max_abs_score_diff": max(diffs),
                "warm_over_cold": out["warm_ms_p50"] / out["cold_ms_p50"],
                "warm_over_uncached": out["warm_ms_p50"] / out["uncached_ms_p50"],
                "tier2_over_cold": out["tier2_ms_p50"] / out["cold_ms_p50"],
                "tier2_bytes_per_block": stats["tier2_bytes_written"] / max(stats["stored"], 1),
                "stats": stats})
    return out


def _drive(score: Callable[[Case], Any], cases: Sequence[Case], concurrency: int) -> dict[str, float]:
    lat: list[float] = []

    def one(case: Case) -> None:
        t0 = time.perf_counter()
        score(case)
        lat.append((time.perf_counter() - t0) * 1000)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, cases))
    wall = time.perf_counter() - t0
    return {"rps": len(cases) / wall, "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99))}


def bench_batching(settings: Settings, artifact_dir: Path, cases: Sequence[Case], concurrency: int,
                   precision: str) -> dict[str, Any]:
    batched = make_stage(settings, artifact_dir, precision=precision, prefix_cache_size=0,
                         batching={"enabled": True, "max_batch": concurrency})
    plain = make_stage(settings, artifact_dir, precision=precision, prefix_cache_size=0)
    lock = threading.Lock()  # unbatched: one model, requests served one forward pass at a time

    def serial(case: Case) -> Any:
        with lock:
            return plain.score(case[0], case[1])

    serial(cases[0])
    batched.score(cases[0][0], cases[0][1])
    try:
        b = _drive(lambda c: batched.score(c[0], c[1]), cases, concurrency)
        u = _drive(serial, cases, concurrency)
        stats = batched.cache_stats()
    finally:
        batched.close()
    return {"concurrency": concurrency, "precision": precision, "rps_batched": b["rps"], "rps_unbatched": u["rps"],
            "speedup": b["rps"] / u["rps"], "p50_batched_ms": b["p50_ms"], "p99_batched_ms": b["p99_ms"],
            "p99_unbatched_ms": u["p99_ms"], "mean_batch": stats["batch_jobs"] / max(stats["batch_batches"], 1)}
