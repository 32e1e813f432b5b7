"""A real uvicorn server in a subprocess on a free loopback port, for benchmarks and tests.

``start_server_subprocess`` runs ``python -m uvicorn --factory`` (several workers: ``serving.run.serve_workers``,
TCP_NODELAY on) with the environment
``serving.run.server_env`` derives from the settings, waits for ``/readyz`` and stops the process
when its block exits; ``free_port`` asks the OS for an unused port.

Deliberately left out: driving traffic (``bench.serving``), process supervision in production
(uvicorn's own manager or the deployment's).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from cascade.settings import Settings
from serving.run import APP_FACTORY, server_env

REPO_ROOT = Path(__file__).resolve().parent.parent
# several workers: a -c program (under `python -m serving.server_process` uvicorn's spawned workers died at start)
SERVE_WORKERS = "import sys; from serving.run import serve_workers; serve_workers(*sys.argv[1:3], *map(int, sys.argv[3:5]))"


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
    cmd = ([sys.executable, "-m", "uvicorn", "--factory", app_factory, "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "warning"] if workers == 1 else  # several: serving.run.serve_workers, Nagle off
           [sys.executable, "-c", SERVE_WORKERS, app_factory, "127.0.0.1", str(port), str(workers)])
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
