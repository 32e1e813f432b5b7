"""``recsys serve`` stopped by a signal, for real: SIGHUP, SIGINT and SIGTERM each drain and stop the
server with exit status 128 + signum, with one worker or two, and leave no child process behind (the
embedded redis-server, the workers). A tiny cascade is trained once (the session's ``tiny_cascade``); each
case starts the CLI in its own session, so a signal sent to its process group (a closed terminal)
reaches nothing else.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from cascade.settings import ENV_REDIS_URL, Settings
from serving.server_process import REPO_ROOT, free_port
from tests.trained_cascade import write_config


@pytest.fixture(scope="module")
def served(tiny_cascade: tuple[Path, Settings], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("served")
    shutil.copytree(tiny_cascade[0], root / "synthetic")  # serve keeps its Redis state under the artifacts
    return root / "synthetic", write_config(root / "tiny.yaml")


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, their children, ...), from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parents[int(entry)] = int(fields[1])
    out, frontier = [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        out += children
        frontier = children
    return out


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                out.append(pid)
        except OSError:
            continue
    return out


def answered(url: str, within_s: float = 120.0) -> int:
    """The status of a recommend request, asked again while it is 503: with several workers ``/readyz``
    answers from one of them, and another may still be loading its artifacts (503 "not ready yet")."""
    deadline = time.monotonic() + within_s
    while True:
        status = httpx.post(f"{url}/v1/recommend", json={"user_id": "u001", "k": 3}, timeout=30).status_code
        if status != 503 or time.monotonic() > deadline:
            return status
        time.sleep(0.2)


def start(artifacts: Path, config: Path, workers: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != ENV_REDIS_URL}  # serve starts its embedded Redis
    env["PYTHONPATH"] = str(REPO_ROOT)
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--artifacts", str(artifacts), "--config",
                             str(config), "--port", str(port), "--workers", str(workers)],
                            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(1500):
        if proc.poll() is not None:
            output = proc.stdout.read().decode() if proc.stdout else ""
            raise AssertionError(f"serve exited with {proc.returncode}: {output[-2000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("serve never became ready")


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(("sig", "to_group"), [(signal.SIGHUP, False), (signal.SIGINT, False),
                                               (signal.SIGTERM, False), (signal.SIGHUP, True)])
def test_a_signal_drains_and_stops_serve_with_its_documented_status(
        served: tuple[Path, Path], workers: int, sig: signal.Signals, to_group: bool) -> None:
    proc, url = start(*served, workers)
    try:
        assert answered(url) == 200
        children = descendants(proc.pid)
        assert len(children) >= 1 + (workers if workers > 1 else 0)  # the embedded redis-server, the workers
        (os.killpg if to_group else os.kill)(proc.pid, sig)
        status = proc.wait(timeout=120)
        output = proc.stdout.read().decode() if proc.stdout else ""
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert status == 128 + sig, output[-2000:]
    assert "Traceback" not in output
    deadline = time.monotonic() + 10  # a child reaped by its own parent a moment after
    while alive(children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert alive(children) == []
