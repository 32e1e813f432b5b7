"""Serving benchmark: drive a running server over loopback for a fixed time, report percentiles.

``bench_run`` runs ``concurrency`` closed-loop clients (each sends its next call when the
previous answer arrives) for ``seconds``, bounded also by ``max_requests``. The traffic mix,
meant to look like a real front end rather than a cold loop over every user:

- users are drawn from a Zipf law (exponent ``zipf_s``, default 1.1) over the split's real
  user ids in a seeded random order, so a hot minority sends most requests, as on real
  sites; repeat calls of a hot user within ``result_cache_ttl_s`` are answered from the cache;
- ``event_share`` (default 5 %) of the calls are ``POST /v1/events`` clicks by such a user on
  a random catalog item: they bump that user's history version, so its next recommendation
  misses the cache and runs the pipeline again;
- every run sends its own ``context`` (``{"bench_run": tag}``), so one run never reuses the
  cache entries of an earlier run; ``llm`` (true/false) pins every call to one path.

Latency figures are client-side wall times of successful recommendations only, overall and
per answer path (``by_path``: cache hits apart from pipeline answers); events are counted apart.
Each run also records the machine's load average before and after it (``loadavg_1m``).

``bench_serve`` measures each path on its own (a mixed "LLM share" row would mostly time cache hits,
and would not show whether the LLM was loaded at all):

- ``light_nocache``: a server with the result cache off, every call ``llm: false``;
- ``llm``: the same server, the LLM stage loaded (checked on ``/readyz``; a configured LLM that
  failed to load is an error, not a row), each user's first call (cold prefix) and a second
  one that misses the result cache (warm prefix), see ``bench.llm_path``;
- ``cache_mix``: a server with the result cache on, the Zipf mix per ``llm_share``, its
  cache hits reported apart from the calls that ran the pipeline.

Each server is a real uvicorn process on a free loopback port (``serving.server_process``).

Deliberately left out: asserting targets (the caller writes the JSON report and judges),
open-loop load generation.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import numpy as np

from bench.llm_path import (
    bench_llm_path,
    bench_llm_precisions,
    latency_summary,
    llm_stage_names,
    require_llm_loaded,
    served_llm_settings,
)
from cascade.settings import Settings
from recsys.redis_server import EmbeddedRedis
from serving.run import APP_FACTORY
from serving.server_process import start_server_subprocess


def zipf_weights(n: int, s: float) -> np.ndarray:
    """Probabilities proportional to 1 / rank**s for ranks 1..n.

    >>> zipf_weights(3, 1.0).round(3).tolist()
    [0.545, 0.273, 0.182]
    """
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** s
    return w / w.sum()


def bench_run(
    base_url: str,
    user_ids: Sequence[str],
    item_ids: Sequence[str],
    seconds: float = 10.0,
    concurrency: int = 1,
    max_requests: int = 200_000,
    k: int = 10,
    event_share: float = 0.05,
    zipf_s: float = 1.1,
    run_tag: str = "run",
    seed: int = 0,
    timeout_s: float = 30.0,
    llm: bool | None = None,
) -> dict[str, Any]:
    """One timed run of the mix described in the module docstring; the report dict."""
    if not user_ids or not item_ids:
        raise ValueError("bench_run: user_ids and item_ids must not be empty")
    if concurrency < 1 or seconds <= 0 or max_requests < 1:
        raise ValueError(f"bench_run: need concurrency >= 1, seconds > 0, max_requests >= 1; "
                         f"got {concurrency}, {seconds}, {max_requests}")
    load_before = _loadavg()
    t_start = time.perf_counter()
    traffic = drive(base_url, user_ids, item_ids, seconds=seconds, concurrency=concurrency,
                    max_requests=max_requests, k=k, event_share=event_share, zipf_s=zipf_s, seed=seed,
                    run_tag=run_tag, timeout_s=timeout_s, llm=llm)
    latencies = [ms for _, ms in traffic.records if ms is not None]
    report = summarise(latencies, traffic.errors, traffic.paths, concurrency, time.perf_counter() - t_start)
    report["by_path"] = {path: latency_summary(ms) for path, ms in sorted(traffic.path_ms.items())}
    report["events"] = dict(traffic.events)
    # the machine's 1-minute load average before and after: on a shared box it says what else competed
    report["loadavg_1m"] = {"before": load_before, "after": _loadavg()}
    return report


def _loadavg() -> float | None:
    """The 1-minute load average (None where the platform has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


class Traffic(NamedTuple):
    """What ``drive`` saw: per recommendation (seconds since start, latency ms or None on error),
    error kinds, event statuses, serving paths (cache/light/llm/fallback) and latencies per path."""

    records: list[tuple[float, float | None]]
    errors: Counter[str]
    events: Counter[str]
    paths: Counter[str]
    path_ms: dict[str, list[float]]


def drive(
    base_url: str, user_ids: Sequence[str], item_ids: Sequence[str], *, seconds: float, concurrency: int,
    max_requests: int, k: int = 10, event_share: float = 0.05, zipf_s: float = 1.1, seed: int = 0,
    run_tag: str = "run", timeout_s: float = 30.0, llm: bool | None = None,
) -> Traffic:
    """``concurrency`` closed-loop clients for ``seconds`` (at most ``max_requests`` calls in all).

    The one traffic loop shared by ``bench_run`` and the soak (``bench.soak``).
    """
    order = np.random.default_rng(seed).permutation(len(user_ids))
    users = [user_ids[i] for i in order]
    probs = zipf_weights(len(users), zipf_s)
    traffic = Traffic([], Counter(), Counter(), Counter(), {})
    lock = threading.Lock()
    budget = [max_requests]
    t_start = time.monotonic()
    stop_at = t_start + seconds

    def client_loop(worker: int) -> None:
        rng = np.random.default_rng([seed, worker])
        with httpx.Client(base_url=base_url, timeout=timeout_s) as client:
            while time.monotonic() < stop_at:
                with lock:
                    if budget[0] <= 0:
                        return
                    budget[0] -= 1
                user = users[int(rng.choice(len(users), p=probs))]
                if rng.random() < event_share:
                    _send_event(client, user, item_ids[int(rng.integers(len(item_ids)))], rng, traffic.events, lock)
                    continue
                _send_recommend(client, user, k, run_tag, t_start, traffic, lock, llm)

    threads = [threading.Thread(target=client_loop, args=(w,)) for w in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return traffic


def _send_recommend(client: httpx.Client, user: str, k: int, tag: str, t_start: float, traffic: Traffic,
                    lock: threading.Lock, llm: bool | None = None) -> None:
    t0 = time.monotonic()
    path = ""  # set whenever kind stays None
    body: dict[str, Any] = {"user_id": user, "k": k, "context": {"bench_run": tag}}
    if llm is not None:
        body["llm"] = llm
    try:
        resp = client.post("/v1/recommend", json=body)
        kind = None if resp.status_code == 200 else f"http_{resp.status_code}"
        if kind is None:
            path = resp.json()["path"]
    except httpx.HTTPError as exc:
        kind = type(exc).__name__
    t1 = time.monotonic()
    with lock:
        traffic.records.append((t0 - t_start, (t1 - t0) * 1000 if kind is None else None))
        if kind is None:
            traffic.paths[path] += 1
            traffic.path_ms.setdefault(path, []).append((t1 - t0) * 1000)
        else:
            traffic.errors[kind] += 1


def _send_event(client: httpx.Client, user: str, item: str, rng: np.random.Generator,
                events: Counter[str], lock: threading.Lock) -> None:
    body = {"event_id": f"bench-{rng.integers(1 << 62):x}", "user_id": user, "item_id": item, "type": "click"}
    try:
        status = str(client.post("/v1/events", json=body).status_code)
    except httpx.HTTPError as exc:
        status = type(exc).__name__
    with lock:
        events[status] += 1


def bench_serve(
    settings: Settings, artifact_dir: Path, user_ids: Sequence[str], item_ids: Sequence[str], *,
    seconds: float = 10.0, concurrencies: Sequence[int] = (1, 4, 8), llm_concurrencies: Sequence[int] = (1, 4),
    llm_users: int = 16, llm_shares: Sequence[float] = (0.0,), app_factory: str = APP_FACTORY,
    llm_precisions: Sequence[str] = (), work_dir: Path | None = None, workers: int = 1, **run_kwargs: Any,
) -> dict[str, Any]:
    """The three sections of the module docstring against real server subprocesses sharing one Redis.

    ``workers``: uvicorn worker processes of the light and cache-mix servers (``serving.server_process``),
    sharing the one Redis and a Prometheus multi-process directory, as ``recsys serve --workers`` runs them.

    ``llm`` is ``{"skipped": reason}`` when the settings enable no LLM stage; a configured LLM stage
    that fails to load raises ``RuntimeError``; ``llm_shares`` above 0 without one raise ``ValueError``.
    ``llm_precisions`` (fp32, bf16, int8) adds ``llm_precisions``: the LLM rows again at each, one server
    each, with the forward floor (``bench.llm_path.bench_llm_precisions``; int8 calibrated into ``work_dir``).
    """
    llm_names = llm_stage_names(settings)
    if (any(s > 0 for s in llm_shares) or llm_precisions) and not llm_names:
        raise ValueError(f"llm_shares {list(llm_shares)} and llm_precisions {list(llm_precisions)} need an enabled "
                         "LLM stage; the config has none (try configs/pipeline_llm.yaml)")
    if workers < 1:
        raise ValueError(f"bench_serve: workers must be >= 1, got {workers}")
    report: dict[str, Any] = {"seconds_per_run": seconds, "workers": workers,
                              "served_llm": served_llm_settings(settings)}
    embedded = None if settings.resolve_redis_url() else EmbeddedRedis()
    try:
        if embedded is not None:
            settings = settings.model_copy(update={"redis_url": embedded.start()})
        with _server(_serving(settings, result_cache_ttl_s=0.0), artifact_dir, app_factory, workers) as url:
            loaded = require_llm_loaded(url, llm_names)
            report["light_nocache"] = [
                {"concurrency": conc, **bench_run(url, user_ids, item_ids, seconds=seconds, concurrency=conc,
                                                  run_tag=f"light-c{conc}-{time.time():.0f}", llm=False,
                                                  **run_kwargs)}
                for conc in concurrencies]
            if llm_names:
                report["llm"] = bench_llm_path(url, user_ids, llm_concurrencies, llm_users,
                                               k=run_kwargs.get("k", 10), stage=llm_names[0])
            else:
                report["llm"] = {"skipped": "no enabled LLM stage in the config (try configs/pipeline_llm.yaml)"}
        if llm_precisions:
            report["llm_precisions"] = bench_llm_precisions(
                _serving(settings, result_cache_ttl_s=0.0), artifact_dir, user_ids, llm_precisions, llm_concurrencies,
                llm_users, work_dir=work_dir or Path("/tmp/recsys-bench-serve"), k=run_kwargs.get("k", 10),
                app_factory=app_factory)
        report["cache_mix"] = []
        for share in llm_shares:
            with _server(_serving(settings, llm_share=float(share)), artifact_dir, app_factory, workers) as url:
                loaded = require_llm_loaded(url, llm_names)
                for conc in concurrencies:
                    tag = f"share{share}-c{conc}-{time.time():.0f}"
                    rep = bench_run(url, user_ids, item_ids, seconds=seconds, concurrency=conc, run_tag=tag,
                                    **run_kwargs)
                    report["cache_mix"].append({"llm_share": float(share), "llm_stage_loaded": loaded, **rep})
    finally:
        if embedded is not None:
            embedded.close()
    report["mix"] = {"users": f"zipf(s={run_kwargs.get('zipf_s', 1.1)}) over real user ids",
                     "event_share": run_kwargs.get("event_share", 0.05), "k": run_kwargs.get("k", 10),
                     "result_cache_ttl_s": settings.serving.result_cache_ttl_s}
    return report


@contextmanager
def _server(settings: Settings, artifact_dir: Path, app_factory: str, workers: int) -> Iterator[str]:
    """``start_server_subprocess`` with ``workers`` processes; several get their own metrics directory."""
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as metrics_dir:
        extra_env = {"PROMETHEUS_MULTIPROC_DIR": metrics_dir} if workers > 1 else None
        with start_server_subprocess(settings, artifact_dir, app_factory=app_factory, workers=workers,
                                     extra_env=extra_env) as url:
            _wait_all_ready(url, workers, settings.serving.ready_timeout_s)
            yield url


def _wait_all_ready(url: str, workers: int, timeout_s: float) -> None:
    """Until ``workers`` distinct processes have answered ``/readyz`` 200: the server is ready when its first
    worker is, and a run started then would time the others' 503s while they still load."""
    ready: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while len(ready) < workers:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url}: {len(ready)} of {workers} workers ready within {timeout_s:.0f} s")
        resp = httpx.get(url + "/readyz", timeout=10)  # a new connection each: any worker may take it
        if resp.status_code == 200:
            ready.add(int(resp.json()["pid"]))
        time.sleep(0.02)


def _serving(settings: Settings, **serving: Any) -> Settings:
    # one load generator stands for many clients: the per-client events limit would refuse its clicks
    serving = {"events_rate_per_s": 0.0, **serving}
    return settings.model_copy(update={"serving": settings.serving.model_copy(update=serving)})


def summarise(
    latencies: list[float], errors: Counter[str], paths: Counter[str], concurrency: int, wall_s: float
) -> dict[str, Any]:
    """The report dict; latency figures are None when no call succeeded."""
    lat = np.asarray(latencies, dtype=np.float64)
    done = len(lat) + sum(errors.values())

    def pct(q: float) -> float | None:
        return round(float(np.percentile(lat, q)), 3) if len(lat) else None

    return {
        "requests": done,
        "concurrency": concurrency,
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
        "p50_ms": pct(50),
        "p95_ms": pct(95),
        "p99_ms": pct(99),
        "mean_ms": round(float(lat.mean()), 3) if len(lat) else None,
        "max_ms": round(float(lat.max()), 3) if len(lat) else None,
        "rps": round(done / wall_s, 2) if wall_s > 0 else None,
        "wall_s": round(wall_s, 3),
        "paths": dict(paths),
    }
