"""Serving latency benchmark: drive a running server over loopback and report percentiles.

``bench_latency`` sends ``n_requests`` POST /v1/recommend calls (users round-robin) through
one ``httpx.Client``: one after another with ``concurrency=1`` (pure per-request latency),
or from ``concurrency`` threads sharing the client (throughput under load). Latency is the
client-side wall time of each successful call; the run stops early at ``max_duration_s``.
``start_server_subprocess`` starts a real uvicorn process on a free loopback port for it.

Deliberately left out: asserting targets (the caller writes the JSON report and judges),
open-loop load generation (requests are sent closed-loop, each after the previous answer).
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
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from recsys.settings import Settings
from serving.run import APP_FACTORY, server_env

REPO_ROOT = Path(__file__).resolve().parent.parent


def bench_latency(
    base_url: str,
    user_ids: list[str],
    n_requests: int = 1000,
    concurrency: int = 1,
    k: int = 10,
    timeout_s: float = 30.0,
    max_duration_s: float = 600.0,
    warmup: int = 5,
) -> dict[str, Any]:
    """Latency percentiles (ms), throughput and answer paths of ``n_requests`` calls."""
    if not user_ids:
        raise ValueError("bench_latency: user_ids is empty")
    if n_requests < 1 or concurrency < 1:
        raise ValueError(f"bench_latency: n_requests and concurrency must be >= 1, got {n_requests}, {concurrency}")
    url = base_url.rstrip("/") + "/v1/recommend"
    latencies: list[float] = []
    paths: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    lock = threading.Lock()
    stop_at = time.monotonic() + max_duration_s

    with httpx.Client(timeout=timeout_s) as client:
        for i in range(warmup):  # first calls pay lazy initialisation (threads, caches): not measured
            client.post(url, json={"user_id": user_ids[i % len(user_ids)], "k": k})

        def one(i: int) -> None:
            if time.monotonic() > stop_at:
                return
            t0 = time.perf_counter()
            try:
                resp = client.post(url, json={"user_id": user_ids[i % len(user_ids)], "k": k})
            except httpx.HTTPError as exc:
                with lock:
                    errors[type(exc).__name__] += 1
                return
            ms = (time.perf_counter() - t0) * 1000
            with lock:
                if resp.status_code == 200:
                    latencies.append(ms)
                    paths[resp.json()["path"]] += 1
                else:
                    errors[f"http_{resp.status_code}"] += 1

        t_start = time.perf_counter()
        if concurrency == 1:
            for i in range(n_requests):
                one(i)
        else:
            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                list(pool.map(one, range(n_requests)))
        wall_s = time.perf_counter() - t_start

    return summarise(latencies, errors, paths, concurrency, wall_s)


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
) -> Iterator[str]:
    """Run ``python -m uvicorn --factory app_factory`` on 127.0.0.1; yield its base URL once ready.

    ``settings`` is a ``Settings`` object, a pipeline YAML path, or None for the default
    config. Waits for ``/readyz`` to answer 200; raises ``RuntimeError`` with the server's
    log tail if it exits, reports a failed load, or is not ready within ``ready_timeout_s``.
    The server is stopped (SIGTERM, then SIGKILL) when the block exits.
    """
    port = port or free_port()
    env = {**os.environ, **server_env(settings, artifact_dir), **(extra_env or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    if ready_timeout_s is None:
        ready_timeout_s = settings.serving.ready_timeout_s if isinstance(settings, Settings) else 300.0
    cmd = [sys.executable, "-m", "uvicorn", "--factory", app_factory, "--host", "127.0.0.1",
           "--port", str(port), "--log-level", "warning"]
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
