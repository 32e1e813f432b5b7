"""Neither the embedded redis-server nor uvicorn's workers outlive the server, even one killed with SIGKILL.

Real processes: the server (``serving.run.serve``, what ``recsys serve`` runs, on the toy
catalog) in a subprocess, with one worker and with two; its redis-server found among its
children; then ``kill -9`` of the server and a bounded wait for redis-server to be gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from serving.server_process import free_port

REPO = Path(__file__).resolve().parents[2]
_SERVE = """
import sys
from pathlib import Path
import serving.run as run
from tests.serving.toy import toy_settings, use_toy_stage_kinds
use_toy_stage_kinds()
run.APP_FACTORY = "tests.serving.toy:create_toy_app_from_env"  # the workers' factory, with the toy stages
run.serve(toy_settings(), Path(sys.argv[1]), port=int(sys.argv[2]), workers=int(sys.argv[3]))
"""


def _wait_for(check: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


def _stat(pid: int) -> tuple[str, int, str] | None:
    """(command name, parent pid, state) of a process, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
    return name, int(rest[1]), rest[0]


def _children(parent: int) -> dict[int, str]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None and st[1] == parent:
            out[int(entry.name)] = st[0]
    return out


def _running(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[2] != "Z"


@pytest.mark.parametrize("workers", [1, 2])
def test_sigkill_of_the_server_takes_its_embedded_redis_along(toy_dir: Path, workers: int) -> None:
    """``kill -9`` of `recsys serve` left redis-server running (its own session, nobody left to stop it)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # the server starts its own Redis
    env["PYTHONPATH"] = str(REPO)
    server = subprocess.Popen([sys.executable, "-c", _SERVE, str(toy_dir), str(port), str(workers)], cwd=REPO,
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    others: list[int] = []
    try:
        def up() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        assert _wait_for(up), "the server did not start"
        ready: set[int] = set()

        def every_worker_ready() -> bool:  # a worker arms its death signal as it builds its app
            with contextlib.suppress(httpx.TransportError, ValueError, KeyError):
                answer = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
                if answer.status_code == 200:
                    ready.add(int(answer.json()["pid"]))
            return len(ready) >= workers

        assert _wait_for(every_worker_ready, timeout_s=120), f"only workers {sorted(ready)} became ready"
        children = _children(server.pid)
        [redis_pid] = [pid for pid, name in children.items() if name == "redis-server"]
        others = [pid for pid, name in children.items() if name != "redis-server"]  # uvicorn's workers, if any
        server.send_signal(signal.SIGKILL)
        server.wait()
        assert _wait_for(lambda: not _running(redis_pid), timeout_s=20), f"redis-server {redis_pid} outlived its server"
        # nor do uvicorn's workers: orphaned, they would keep serving (without Redis) and hold the port
        assert _wait_for(lambda: not any(_running(pid) for pid in others), timeout_s=90), \
            f"workers {[p for p in others if _running(p)]} outlived their supervisor"
        assert (toy_dir / "state" / "redis" / "appendonly.aof").exists()  # it kept its file for the next start
    finally:
        for pid in others:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        server.kill()
        server.wait()
