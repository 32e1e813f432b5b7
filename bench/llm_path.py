"""The LLM path of ``recsys bench serve``: cold and warm prefix, per concurrency, LLM loaded.

For each concurrency level, ``n_users`` users not used before in the run each send two
``llm: true`` recommendations through ``concurrency`` client threads: first all the cold
calls (the user's first request: only the instruction blocks it shares with other users
can be cached), then all the warm calls (the same user and candidates again, with another
``context`` so the result cache cannot answer: the prompt's blocks are in tier 1). Each
phase reports the client latency, the LLM stage's own time from the answer's ``stages``,
the answer paths (a ``fallback`` is the LLM giving up on its budget) and the
``recsys_llm_prefix_cache_*`` counters of ``/metrics`` over the phase (two scrapes).

Warm calls go only to the users whose blocks tier 1 still holds after the cold phase
(``warm_users``): the blocks in tier 1 are the stored ones minus the evicted ones (process
totals from ``/metrics``), the cold users the most recent of them, so the last
``blocks held // blocks per cold user`` cold users are warm. Otherwise a phase larger than tier 1
(``llm.kv.tier1_bytes``; 256 MiB held ~11 fp32 SmolLM2-135M prompts) measures LRU evictions,
not the warm prefix: every warm call then misses, as the first LLM-path report did.

``bench_llm_precisions`` repeats those rows with every LLM stage at each of several precisions
(fp32, bf16, int8: SmoothQuant W8A8, calibrated first on other users' prompts unless the config
names an ``int8_dir``), one fresh server each, the same users at each, and adds per precision the
*forward floor* (``forward_floor``): in this process, the same model at the same precision, each of
some validation users' warm prompts timed two ways, the whole stage call (prompt, block look-up, KV
assembly, forward, scores) and the model's own forward pass alone over the same uncached tail with
the same cached blocks already assembled. A warm stage figure minus the floor is what a warm
request costs beyond its arithmetic.

Deliberately left out: the light path and the cache mix (``bench.serving``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.llm_stage import ensure_calibrated
from cascade.settings import Settings
from jobs.evaluation.llm_cases import make_stage, set_threads, torch_threads
from llm_rerank.backbone import resolve_precision
from llm_rerank.kvcache import block_keys
from offline.split import Split
from recsys.contract import Request
from serving.metrics import llm_cache_counts
from serving.run import APP_FACTORY
from serving.server_process import start_server_subprocess

PRECISIONS = ("fp32", "bf16", "int8")


def llm_stage_names(settings: Settings) -> list[str]:
    """The enabled stages of kind ``llm``, in pipeline order."""
    return [spec.name for spec in settings.pipeline.stages if spec.enabled and spec.kind == "llm"]


def served_llm_settings(settings: Settings) -> dict[str, Any]:
    """Per enabled LLM stage, the serving options in effect (``settings.llm`` with the stage's params)."""
    out = {}
    for spec in settings.pipeline.stages:
        if spec.enabled and spec.kind == "llm":
            cfg = settings.llm.with_overrides(dict(spec.params))

            out[spec.name] = {"model": cfg.model, "precision": resolve_precision(cfg.precision),
                              "precision_setting": cfg.precision, "scoring": cfg.scoring,
                              "candidates": cfg.candidates, "threads": cfg.threads, "budget_ms": spec.budget_ms,
                              "kv": cfg.kv.model_dump(include={"enabled", "block_tokens", "tier1_bytes", "tier2"}),
                              "batching": cfg.batching.enabled, "prefix_cache_size": cfg.prefix_cache_size}
    return out


def bench_llm_path(base_url: str, user_ids: Sequence[str], concurrencies: Sequence[int], n_users: int, *,
                   k: int = 10, stage: str = "llm", seed: int = 0, timeout_s: float = 60.0) -> dict[str, Any]:
    """``{"rows": [...], ...}``: per concurrency, the cold and warm phases of the module docstring."""
    if n_users < 1 or not concurrencies or min(concurrencies) < 1:
        raise ValueError(f"bench_llm_path: need n_users >= 1 and concurrencies >= 1; got {n_users}, {concurrencies}")
    needed = 1 + n_users * len(concurrencies)
    if len(user_ids) < needed:
        raise ValueError(f"bench_llm_path: {len(user_ids)} users, need {needed} distinct ones")
    order = [user_ids[i] for i in np.random.default_rng(seed).permutation(len(user_ids))]
    tag = f"llm-{time.time():.0f}"
    with httpx.Client(base_url=base_url, timeout=timeout_s) as client:  # first call: one-off allocations
        warmup = _call(client, order[0], k, tag, "warmup", stage)
    rows = []
    for n, conc in enumerate(concurrencies):
        users = order[1 + n * n_users : 1 + (n + 1) * n_users]
        row: dict[str, Any] = {"concurrency": conc, "users": len(users)}
        row["cold"] = _phase(base_url, users, conc, k, f"{tag}-c{conc}", "cold", stage, timeout_s)
        warm_users = users_in_tier1(users, row["cold"]["prefix_cache"], _cache_counts(base_url))
        row["warm_users"] = len(warm_users)
        row["warm"] = _phase(base_url, warm_users, conc, k, f"{tag}-c{conc}", "warm", stage, timeout_s)
        cold, warm = row["cold"]["stage_ms"]["p50_ms"], row["warm"]["stage_ms"]["p50_ms"]
        row["warm_over_cold_stage_p50"] = round(warm / cold, 4) if cold and warm is not None else None
        rows.append(row)
    return {"rows": rows, "stage": stage, "k": k, "warmup_call": warmup}


def users_in_tier1(users: Sequence[str], cold: dict[str, Any], totals: dict[str, float]) -> list[str]:
    """The last of the cold phase's ``users`` whose prompt blocks tier 1 still holds.

    ``cold``: the cold phase's counter deltas (``stored`` blocks for these users); ``totals``: the
    process totals now. Tier 1 holds ``stored - tier1_evictions`` blocks in all, the most recent
    ones, which are the cold users' last prompts.

    >>> users_in_tier1(["a", "b", "c", "d"], {"stored": 40}, {"stored": 50, "tier1_evictions": 25})
    ['c', 'd']
    >>> users_in_tier1(["a", "b"], {"stored": 20}, {"stored": 20, "tier1_evictions": 0})
    ['a', 'b']
    """
    per_user = cold.get("stored", 0) / len(users) if users else 0
    if per_user <= 0:  # nothing stored (every block was already cached): all are warm
        return list(users)
    held = max(totals.get("stored", 0) - totals.get("tier1_evictions", 0), 0)
    kept = min(int(held // per_user), len(users))
    return list(users[len(users) - kept:]) if kept else []


def latency_summary(ms: Sequence[float]) -> dict[str, float | int | None]:
    """``{"n", "p50_ms", "p99_ms", "mean_ms"}`` of ``ms`` (None figures when empty).

    >>> latency_summary([10.0, 20.0, 30.0])
    {'n': 3, 'p50_ms': 20.0, 'p99_ms': 29.8, 'mean_ms': 20.0}
    """
    lat = np.asarray(ms, dtype=np.float64)
    if not len(lat):
        return {"n": 0, "p50_ms": None, "p99_ms": None, "mean_ms": None}
    return {"n": len(lat), "p50_ms": round(float(np.percentile(lat, 50)), 3),
            "p99_ms": round(float(np.percentile(lat, 99)), 3), "mean_ms": round(float(lat.mean()), 3)}


def _phase(base_url: str, users: Sequence[str], concurrency: int, k: int, tag: str, phase: str, stage: str,
           timeout_s: float) -> dict[str, Any]:
    local, clients = threading.local(), []

    def one(user: str) -> dict[str, Any]:
        if not hasattr(local, "client"):  # one keep-alive connection per client thread
            local.client = httpx.Client(base_url=base_url, timeout=timeout_s)
            clients.append(local.client)
        return _call(local.client, user, k, tag, phase, stage)

    before = _cache_counts(base_url)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        calls = list(pool.map(one, users))
    wall = time.perf_counter() - t0
    for client in clients:
        client.close()
    after = _cache_counts(base_url)
    ok = [c for c in calls if c["error"] is None]
    delta = {key: after[key] - before[key] for key in after}
    requested = delta["blocks_requested"]
    return {
        "client_ms": latency_summary([c["client_ms"] for c in ok]),
        "stage_ms": latency_summary([c["stage_ms"] for c in ok if c["stage_status"] == "ok"]),
        "paths": dict(Counter(c["path"] for c in ok)),
        "stage_status": dict(Counter(c["stage_status"] for c in ok)),
        "errors": dict(Counter(c["error"] for c in calls if c["error"] is not None)),
        "rps": round(len(calls) / wall, 3) if wall > 0 else None,
        "prefix_cache": {**{key: int(v) for key, v in delta.items()},
                         "block_hit_rate": round((delta["tier1_hits"] + delta["tier2_hits"]) / requested, 4)
                         if requested else None},
    }


def _call(client: httpx.Client, user: str, k: int, tag: str, phase: str, stage: str) -> dict[str, Any]:
    """One ``llm: true`` recommendation: client ms, the LLM stage's trace, the answer path."""
    body = {"user_id": user, "k": k, "llm": True, "context": {"bench_run": tag, "pass": phase}}
    t0 = time.perf_counter()
    try:
        resp = client.post("/v1/recommend", json=body)
    except httpx.HTTPError as exc:
        return {"error": type(exc).__name__, "client_ms": None, "stage_ms": None, "stage_status": None, "path": None}
    ms = (time.perf_counter() - t0) * 1000
    if resp.status_code != 200:
        return {"error": f"http_{resp.status_code}", "client_ms": ms, "stage_ms": None, "stage_status": None,
                "path": None}
    answer = resp.json()
    trace = next((s for s in answer["stages"] if s["name"] == stage), {"ms": None, "status": "absent"})
    return {"error": None, "client_ms": ms, "stage_ms": trace["ms"], "stage_status": trace["status"],
            "path": answer["path"], "reason": trace.get("reason", "")}


def _cache_counts(base_url: str) -> dict[str, float]:
    return llm_cache_counts(httpx.get(base_url + "/metrics", timeout=10).text)


def require_llm_loaded(url: str, llm_names: Sequence[str]) -> bool:
    """Whether the server runs its LLM stage(s); raises when one is configured but did not load."""
    ready = httpx.get(url + "/readyz", timeout=10).json()
    missing = [n for n in llm_names if n not in ready["versions"]]
    if missing:
        raise RuntimeError(f"LLM stage(s) {missing} configured but not loaded, so no row would measure them: "
                           f"{ready.get('degraded_stages')}")
    return bool(llm_names)


def at_precision(settings: Settings, precision: str, int8_dir: Path | None = None) -> Settings:
    """``settings`` with ``llm`` and every LLM stage's params at ``precision`` (int8 from ``int8_dir``)."""
    over: dict[str, Any] = {"precision": precision}
    if int8_dir is not None:
        over["int8_dir"] = str(int8_dir)
    stages = [spec.model_copy(update={"params": {**spec.params, **over}}) if spec.kind == "llm" else spec
              for spec in settings.pipeline.stages]
    return settings.model_copy(update={"llm": settings.llm.with_overrides(over),
                                       "pipeline": settings.pipeline.model_copy(update={"stages": stages})})


def bench_llm_precisions(settings: Settings, artifact_dir: Path, user_ids: Sequence[str], precisions: Sequence[str],
                         concurrencies: Sequence[int], n_users: int, *, work_dir: Path, k: int = 10,
                         floor_requests: int = 8, app_factory: str = APP_FACTORY, seed: int = 0) -> dict[str, Any]:
    """``{"rows": [...], ...}``: per precision and concurrency, the cold and warm rows of ``bench_llm_path``
    from a server at that precision, with that precision's forward floor (see the module docstring).

    ``settings`` are the served ones (the caller's serving options); ``work_dir`` receives the int8
    calibration when ``llm.int8_dir`` names none.
    """
    unknown = [p for p in precisions if p not in PRECISIONS]
    names = llm_stage_names(settings)
    if unknown or not precisions or not names:
        raise ValueError(f"bench_llm_precisions: need an enabled LLM stage and precisions among {list(PRECISIONS)}; "
                         f"got stages {names}, precisions {list(precisions)}")
    cases = popular_cases(Split.load(artifact_dir / "split"), 2 * floor_requests, settings.llm.candidates, seed)
    int8_dir = settings.llm.int8_dir
    if "int8" in precisions and int8_dir is None:
        int8_dir = work_dir / "llm_w8a8"
        ensure_calibrated(settings, artifact_dir, int8_dir, cases[floor_requests:], settings.llm.smooth_alpha)
    rows = []
    for precision in precisions:
        served = at_precision(settings, precision, int8_dir if precision == "int8" else None)
        with start_server_subprocess(served, artifact_dir, app_factory=app_factory) as url:
            require_llm_loaded(url, names)
            path = bench_llm_path(url, user_ids, concurrencies, n_users, k=k, stage=names[0], seed=seed)
        floor = forward_floor(served, artifact_dir, cases[:floor_requests])
        for row in path["rows"]:
            warm = row["warm"]["stage_ms"]["p50_ms"]
            rows.append({"precision": precision, **row, "forward_floor": floor,
                         "warm_over_floor_p50_ms": None if warm is None else round(warm - floor["floor_ms"]["p50_ms"], 3)})
    return {"rows": rows, "floor_candidates_from": "popularity",
            "int8_dir": None if int8_dir is None else str(int8_dir)}


def popular_cases(split: Split, n: int, candidates: int, seed: int) -> list[tuple[Request, np.ndarray, int]]:
    """``n`` validation users, each with the ``candidates`` most popular items outside their history.

    Popularity, not the cascade's coarse cut (``bench.llm_stage.bench_requests``): that may retrain
    stale stages first, and the forward floor and int8 calibration need only prompts of the served length.
    """
    users = np.random.default_rng(seed).choice(split.n_users, size=min(n, split.n_users), replace=False)
    by_pop = np.argsort(-split.item_popularity("valid"), kind="stable")
    cases = []
    for u in users:
        history = split.history(int(u), "valid")
        request = dataclasses.replace(split.request(int(u), history, k=candidates), exclude=history)
        cases.append((request, by_pop[~np.isin(by_pop, history)][:candidates], int(split.targets("valid")[u])))
    return cases


def forward_floor(settings: Settings, artifact_dir: Path, cases: Sequence[Any], repeats: int = 3) -> dict[str, Any]:
    """The warm listwise request of each case in this process: the whole stage call, and the model's own
    forward alone over the same uncached tail with the same cached blocks already assembled (the floor)."""
    from llm_rerank.prefix_kv import assembled_cache, run_tail  # lazy: imports torch

    kv = {**settings.llm.kv.model_dump(), "enabled": True, "tier2": False}  # tier 1 only: no Redis here
    stage = make_stage(settings, artifact_dir, kv=kv, batching={"enabled": False})
    if stage.cfg.scoring != "listwise":
        stage.close()
        return {"skipped": f"the floor is a listwise prompt's; llm.scoring is {stage.cfg.scoring!r}"}
    set_threads(stage.cfg.threads)
    blocks, model = stage.local().blocks, stage.local().model
    warm, floor, tails, lengths = [], [], [], []
    for request, items, _ in cases:
        stage.score(request, items)  # cold: fills tier 1
        parts = stage.build_prompt(request, items)
        row = list(parts.prefix) + list(parts.suffixes[0])
        found = blocks.cache.lookup(block_keys(row[:-1], blocks.block_tokens, blocks.namespace))
        cached = len(found) * blocks.block_tokens
        for _ in range(repeats):
            t0 = time.perf_counter()
            stage.score(request, items)
            warm.append((time.perf_counter() - t0) * 1000)
            cache = assembled_cache(found, len(row))
            t0 = time.perf_counter()
            run_tail(model, cache, row, cached)
            floor.append((time.perf_counter() - t0) * 1000)
        tails.append(len(row) - cached)
        lengths.append(len(row))
    stage.close()
    return {"requests": len(cases), "repeats": repeats, "threads": torch_threads(),
            "prompt_tokens_mean": round(float(np.mean(lengths)), 1), "tail_tokens_mean": round(float(np.mean(tails)), 1),
            "stage_ms": latency_summary(warm), "floor_ms": latency_summary(floor)}
