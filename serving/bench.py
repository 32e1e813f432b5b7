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
  cache entries of an earlier run.

Latency figures are client-side wall times of successful recommendations only; events are
counted apart. ``bench_serve`` starts one embedded Redis, then per ``llm_share`` one server
subprocess, and runs every concurrency level against it. ``start_server_subprocess`` starts
a real uvicorn process on a free loopback port.

Deliberately left out: asserting targets (the caller writes the JSON report and judges),
open-loop load generation.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
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

from recsys.settings import Settings
from serving.run import APP_FACTORY, server_env

REPO_ROOT = Path(__file__).resolve().parent.parent


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
) -> dict[str, Any]:
    """One timed run of the mix described in the module docstring; the report dict."""
    if not user_ids or not item_ids:
        raise ValueError("bench_run: user_ids and item_ids must not be empty")
    if concurrency < 1 or seconds <= 0 or max_requests < 1:
        raise ValueError(f"bench_run: need concurrency >= 1, seconds > 0, max_requests >= 1; "
                         f"got {concurrency}, {seconds}, {max_requests}")
    t_start = time.perf_counter()
    traffic = drive(base_url, user_ids, item_ids, seconds=seconds, concurrency=concurrency,
                    max_requests=max_requests, k=k, event_share=event_share, zipf_s=zipf_s, seed=seed,
                    run_tag=run_tag, timeout_s=timeout_s)
    latencies = [ms for _, ms in traffic.records if ms is not None]
    report = summarise(latencies, traffic.errors, traffic.paths, concurrency, time.perf_counter() - t_start)
    report["events"] = dict(traffic.events)
    return report


class Traffic(NamedTuple):
    """What ``drive`` saw: per recommendation (seconds since start, latency ms or None on error),
    error kinds, event statuses and serving paths (cache/light/llm/fallback)."""

    records: list[tuple[float, float | None]]
    errors: Counter[str]
    events: Counter[str]
    paths: Counter[str]


def drive(
    base_url: str, user_ids: Sequence[str], item_ids: Sequence[str], *, seconds: float, concurrency: int,
    max_requests: int, k: int = 10, event_share: float = 0.05, zipf_s: float = 1.1, seed: int = 0,
    run_tag: str = "run", timeout_s: float = 30.0,
) -> Traffic:
    """``concurrency`` closed-loop clients for ``seconds`` (at most ``max_requests`` calls in all).

    The one traffic loop shared by ``bench_run`` and the soak (``serving.soak``).
    """
    order = np.random.default_rng(seed).permutation(len(user_ids))
    users = [user_ids[i] for i in order]
    probs = zipf_weights(len(users), zipf_s)
    traffic = Traffic([], Counter(), Counter(), Counter())
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
                _send_recommend(client, user, k, run_tag, t_start, traffic, lock)

    threads = [threading.Thread(target=client_loop, args=(w,)) for w in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return traffic


def _send_recommend(client: httpx.Client, user: str, k: int, tag: str, t_start: float, traffic: Traffic,
                    lock: threading.Lock) -> None:
    t0 = time.monotonic()
    path = ""  # set whenever kind stays None
    try:
        resp = client.post("/v1/recommend", json={"user_id": user, "k": k, "context": {"bench_run": tag}})
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
    seconds: float = 10.0, concurrencies: Sequence[int] = (1, 4, 8), llm_shares: Sequence[float] = (0.0, 0.3, 1.0),
    app_factory: str = APP_FACTORY, **run_kwargs: Any,
) -> dict[str, Any]:
    """Every (llm_share, concurrency) run against real server subprocesses sharing one Redis."""
    from serving.redis_state import EmbeddedRedis, redis_url

    runs = []
    llm_names = {spec.name for spec in settings.pipeline.stages if spec.kind == "llm"}
    embedded = None if redis_url(settings) else EmbeddedRedis()
    try:
        if embedded is not None:
            settings = settings.model_copy(update={"redis_url": embedded.start()})
        for share in llm_shares:
            serving = settings.serving.model_copy(update={"llm_share": float(share)})
            run_settings = settings.model_copy(update={"serving": serving})
            with start_server_subprocess(run_settings, artifact_dir, app_factory=app_factory) as url:
                serving_now = httpx.get(url + "/readyz", timeout=10).json()["versions"]  # enabled, loaded stages
                for conc in concurrencies:
                    tag = f"share{share}-c{conc}-{time.time():.0f}"
                    rep = bench_run(url, user_ids, item_ids, seconds=seconds, concurrency=conc, run_tag=tag,
                                    **run_kwargs)
                    runs.append({"concurrency": conc, "llm_share": float(share), **rep,
                                 "llm_stage_loaded": any(n in serving_now for n in llm_names)})
    finally:
        if embedded is not None:
            embedded.close()
    return {"runs": runs, "seconds_per_run": seconds,
            "mix": {"users": f"zipf(s={run_kwargs.get('zipf_s', 1.1)}) over real user ids",
                    "event_share": run_kwargs.get("event_share", 0.05), "k": run_kwargs.get("k", 10),
                    "result_cache_ttl_s": settings.serving.result_cache_ttl_s}}


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


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def start_server_subprocess(
    settings: Settings | Path | None,
    artifact_dir: Path,
    port: int | None = None,
    *,
    app_factory: str = APP_FACTORY,
    extra_env: dict[str, str] | None = None,
    ready_timeout_s: float | None = None,
    workers: int = 1,
) -> Iterator[str]:
    """Run ``python -m uvicorn --factory app_factory`` on 127.0.0.1; yield its base URL once ready.

    ``settings`` is a ``Settings`` object, a pipeline YAML path, or None for the default
    config. ``workers > 1`` runs uvicorn's process manager (the caller provides a shared Redis
    through ``settings.redis_url`` or ``REDIS_URL``, and ``PROMETHEUS_MULTIPROC_DIR`` in
    ``extra_env`` for aggregated metrics). Waits for ``/readyz`` to answer 200; raises ``RuntimeError`` with the server's
    log tail if it exits, reports a failed load, or is not ready within ``ready_timeout_s``.
    The server is stopped (SIGTERM, then SIGKILL) when the block exits.
    """
    port = port or free_port()
    env = {**os.environ, **server_env(settings, artifact_dir), **(extra_env or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    if ready_timeout_s is None:
        ready_timeout_s = settings.serving.ready_timeout_s if isinstance(settings, Settings) else 300.0
    cmd = [sys.executable, "-m", "uvicorn", "--factory", app_factory, "--host", "127.0.0.1",
           "--port", str(port), "--log-level", "warning"] + (["--workers", str(workers)] if workers > 1 else [])
    base_url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log_file:
        proc = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            _wait_ready(proc, base_url, ready_timeout_s, log_file)
            yield base_url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_ready(proc: subprocess.Popen, base_url: str, timeout_s: float, log_file: Any) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before ready:\n{_tail(log_file)}")
        try:
            resp = httpx.get(base_url + "/readyz", timeout=2.0)
        except httpx.HTTPError:
            resp = None  # not listening yet
        if resp is not None and resp.status_code == 200:
            return
        is_json = resp is not None and resp.headers.get("content-type") == "application/json"
        if resp is not None and is_json and resp.json().get("status") == "failed":
            raise RuntimeError(f"server failed to load artifacts: {resp.json().get('detail')}")
        time.sleep(0.1)
    raise RuntimeError(f"server not ready within {timeout_s:.0f} s:\n{_tail(log_file)}")


def _tail(log_file: Any, n_bytes: int = 4000) -> str:
    log_file.flush()
    log_file.seek(0)
    return log_file.read().decode(errors="replace")[-n_bytes:]
