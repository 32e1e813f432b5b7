"""Soak benchmark: hold a concurrency against a real server for a while; watch errors, latency, memory.

``soak`` starts one server subprocess (``bench.serving.start_server_subprocess``) on the
artifacts, with an embedded Redis owned here (so the server's memory is measured alone;
Redis's is reported apart), warms it up, records the resident memory (RSS, psutil) of the
server process and its children, then runs ``concurrency`` closed-loop clients for
``seconds`` (also bounded by ``max_requests``) with the traffic mix of ``bench.serving``
(Zipf users, a share of click events). It reports overall and per-window (``window_s``,
default 10 s) request counts, errors and latency percentiles, and RSS at start and end:
a leak shows as RSS growing window after window, a slow leak of latency as rising p99.

Deliberately left out: judging the figures (the caller compares ``rss_growth`` and the
errors against its targets) and open-loop arrival processes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

from bench.serving import drive
from cascade.settings import Settings
from recsys.redis_server import EmbeddedRedis
from serving.run import APP_FACTORY
from serving.server_process import start_server_subprocess


def process_rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` plus all its descendants, in MiB."""
    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            continue  # a child that exited between listing and reading
    return round(total / 2**20, 2)


def percentiles(latencies_ms: Sequence[float]) -> dict[str, float | None]:
    """p50/p99 of ``latencies_ms`` (None when empty).

    >>> percentiles([1.0, 2.0, 3.0])
    {'p50_ms': 2.0, 'p99_ms': 2.98}
    """
    if not len(latencies_ms):
        return {"p50_ms": None, "p99_ms": None}
    lat = np.asarray(latencies_ms, dtype=np.float64)
    return {"p50_ms": round(float(np.percentile(lat, 50)), 3), "p99_ms": round(float(np.percentile(lat, 99)), 3)}


def windows(records: list[tuple[float, float | None]], seconds: float, window_s: float) -> list[dict[str, Any]]:
    """Per-window figures of ``records`` = (seconds since start, latency ms or None for an error).

    >>> windows([(0.5, 10.0), (1.5, None), (1.6, 30.0)], 2.0, 1.0)[1]
    {'start_s': 1.0, 'end_s': 2.0, 'requests': 2, 'errors': 1, 'p50_ms': 30.0, 'p99_ms': 30.0}
    """
    n = max(1, int(np.ceil(seconds / window_s)))
    out = []
    for w in range(n):
        lo, hi = w * window_s, min((w + 1) * window_s, seconds) if w < n - 1 else float("inf")
        inside = [ms for t, ms in records if lo <= t < hi]
        ok = [ms for ms in inside if ms is not None]
        out.append({"start_s": round(lo, 3), "end_s": round(min(hi, seconds), 3), "requests": len(inside),
                    "errors": len(inside) - len(ok), **percentiles(ok)})
    return out


def soak(
    settings: Settings, artifact_dir: Path, user_ids: Sequence[str], item_ids: Sequence[str], *,
    concurrency: int = 8, seconds: float = 60.0, max_requests: int = 1_000_000, window_s: float = 10.0,
    warmup_s: float = 5.0, app_factory: str = APP_FACTORY, **mix: Any,
) -> dict[str, Any]:
    """The soak report (see the module docstring); ``mix`` goes to ``drive`` (k, event_share, ...)."""
    if concurrency < 1 or seconds <= 0 or window_s <= 0 or max_requests < 1:
        raise ValueError(f"soak: need concurrency >= 1, seconds > 0, window_s > 0, max_requests >= 1; got "
                         f"{concurrency}, {seconds}, {window_s}, {max_requests}")
    if not user_ids or not item_ids:
        raise ValueError("soak: user_ids and item_ids must not be empty")
    embedded = None if settings.resolve_redis_url() else EmbeddedRedis()
    try:
        if embedded is not None:
            settings = settings.model_copy(update={"redis_url": embedded.start()})
        # one load generator stands for many clients: the per-client events limit would refuse its clicks
        settings = settings.model_copy(update={"serving": settings.serving.model_copy(
            update={"events_rate_per_s": 0.0})})
        with start_server_subprocess(settings, artifact_dir, app_factory=app_factory) as url:
            ready = httpx.get(url + "/readyz", timeout=10).json()
            pid = int(ready["pid"])
            if warmup_s > 0:  # caches, lazy imports, allocator pools: not what a leak looks like
                drive(url, user_ids, item_ids, seconds=warmup_s, concurrency=concurrency,
                      max_requests=max_requests, run_tag="warmup", **mix)
            rss_start = process_rss_mb(pid)
            t0 = time.perf_counter()
            traffic = drive(url, user_ids, item_ids, seconds=seconds, concurrency=concurrency,
                            max_requests=max_requests, run_tag=f"soak-{time.time():.0f}", **mix)
            records, errors, events = traffic.records, traffic.errors, traffic.events
            wall_s = time.perf_counter() - t0
            rss_end = process_rss_mb(pid)
            redis_mb = process_rss_mb(embedded.proc.pid) if embedded is not None and embedded.proc else None
    finally:
        if embedded is not None:
            embedded.close()
    ok = [ms for _, ms in records if ms is not None]
    return {
        "concurrency": concurrency, "seconds": seconds, "requests": len(records), "errors": sum(errors.values()),
        "error_kinds": dict(errors), **percentiles(ok),
        "rss_start_mb": rss_start, "rss_end_mb": rss_end,
        "rss_growth": round((rss_end - rss_start) / rss_start, 4) if rss_start else None,
        "redis_rss_end_mb": redis_mb, "rps": round(len(records) / wall_s, 2), "wall_s": round(wall_s, 3),
        "warmup_s": warmup_s, "events": dict(events), "server_versions": ready.get("versions", {}),
        "windows": windows(records, seconds, window_s),
    }
