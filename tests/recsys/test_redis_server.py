"""The embedded Redis server (``recsys.redis_server``): restarts, supervision, its process's lifetime."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import redis

from recsys.redis_client import connect
from recsys.redis_server import EmbeddedRedis
from tests.serving.toy import toy_settings


def test_embedded_server_stops_and_restarts_on_the_same_socket(tmp_path) -> None:
    server = EmbeddedRedis(tmp_path / "r")
    try:
        client = connect(server.start(), toy_settings().serving.redis_socket_timeout_s)
        client.set("k", "v")
        assert client.get("k") == b"v"
        server.stop()
        with pytest.raises(redis.exceptions.ConnectionError):
            client.get("k")
        server.start()
        assert client.get("k") is None  # no persistence: a restart is an empty Redis
    finally:
        server.close()


def test_embedded_redis_starts_from_a_relative_work_dir(tmp_path, monkeypatch):
    """redis-server chdirs into its --dir: a relative socket path used to make it exit at once."""
    monkeypatch.chdir(tmp_path)
    server = EmbeddedRedis(Path("work") / "redis")
    try:
        url = server.start()
        assert redis.Redis.from_url(url).ping()
    finally:
        server.stop()


def _wait_for(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_supervised_server_is_restarted_after_sigkill_and_tells_its_listeners(tmp_path) -> None:
    """After `kill -9` the supervised child is started again, and its listeners are told."""
    server = EmbeddedRedis(tmp_path / "r", supervise=True)
    restarted = threading.Event()
    server.add_restart_listener(restarted.set)
    try:
        url = server.start()
        assert EmbeddedRedis.supervising(url) is server
        first = server.proc
        assert first is not None
        os.kill(first.pid, signal.SIGKILL)
        assert restarted.wait(timeout=10), "no restart within 10 s"
        assert server.restarts == 1 and server.proc is not first and server.proc.poll() is None
        assert redis.Redis.from_url(url).ping()
    finally:
        server.close()
    assert EmbeddedRedis.supervising(url) is None


def test_stop_is_not_a_crash_and_unsupervised_servers_stay_down(tmp_path) -> None:
    supervised = EmbeddedRedis(tmp_path / "s", supervise=True)
    plain = EmbeddedRedis(tmp_path / "p")
    try:
        supervised.start()
        supervised.stop()  # asked to stop: the supervisor must not bring it back
        plain.start()
        assert plain.proc is not None
        dead = plain.proc
        os.kill(dead.pid, signal.SIGKILL)
        dead.wait()
        time.sleep(0.3)
        assert supervised.proc is None and supervised.restarts == 0
        assert plain.proc is dead and plain.restarts == 0
        supervised.start()  # a stopped supervised server starts again, supervised again
        os.kill(supervised.proc.pid, signal.SIGKILL)
        assert _wait_for(lambda: supervised.restarts == 1)
    finally:
        supervised.close()
        plain.close()


def test_a_process_that_exits_without_stop_takes_its_embedded_redis_along(tmp_path) -> None:
    """`kill -TERM` of `recsys serve` used to leave redis-server orphaned (parent pid 1)."""
    import subprocess
    import sys

    code = ("from recsys.redis_server import EmbeddedRedis\n"
            f"r = EmbeddedRedis({str(tmp_path / 'x')!r}, supervise=True); r.start(); print(r.proc.pid, flush=True)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    pid = int(out.stdout.split()[0])
    assert _wait_for(lambda: not _alive(pid)), f"redis-server {pid} outlived its server"


def test_the_embedded_redis_runs_in_its_own_session(tmp_path) -> None:
    server = EmbeddedRedis(tmp_path / "s")
    try:
        server.start()
        assert server.proc is not None and os.getsid(server.proc.pid) != os.getsid(0)  # a Ctrl-C does not reach it
    finally:
        server.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
