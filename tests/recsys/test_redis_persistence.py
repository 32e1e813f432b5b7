"""The embedded Redis on disk and in memory: append-only file, one server per data directory, memory cap,
and a redis-server that dies with the process that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from recsys import redis_server
from recsys.redis_client import connect
from recsys.redis_server import EmbeddedRedis, StateDirInUse


def _wait_for(check: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    """Poll ``check`` until it holds (a bounded wait for a state, not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent's ``wait`` counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_killed_server_comes_back_with_what_it_acknowledged(tmp_path: Path) -> None:
    """``kill -9`` of the embedded redis-server used to come back empty: every event, history and version gone."""
    server = EmbeddedRedis(tmp_path / "sock", supervise=True, data_dir=tmp_path / "state")
    try:
        client = connect(server.start(), 1.0)
        for n in range(500):
            client.xadd("ns:events", {"n": str(n)})
        client.set("ns:versions:rules:active", "v7")
        assert server.proc is not None
        first = server.proc.pid
        os.kill(first, signal.SIGKILL)
        assert _wait_for(lambda: server.restarts == 1)
        assert server.proc is not None and server.proc.pid != first
        assert client.xlen("ns:events") == 500 and client.get("ns:versions:rules:active") == b"v7"
        assert (tmp_path / "state" / "appendonly.aof").stat().st_size > 0
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
    finally:
        server.close()
    again = EmbeddedRedis(tmp_path / "sock2", data_dir=tmp_path / "state")  # a new server process reloads it too
    try:
        assert connect(again.start(), 1.0).xlen("ns:events") == 500
    finally:
        again.close()


def test_without_a_data_dir_nothing_is_kept(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "s")
    try:
        client = connect(server.start(), 1.0)
        client.set("k", "v")
        assert client.config_get("appendonly") == {"appendonly": "no"}
    finally:
        server.close()
    assert not list(tmp_path.rglob("*.aof"))


def test_two_servers_never_share_one_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis_server, "LOCK_WAIT_S", 0.3)
    first = EmbeddedRedis(tmp_path / "a", data_dir=tmp_path / "state")
    second = EmbeddedRedis(tmp_path / "b", data_dir=tmp_path / "state")
    try:
        first.start()
        with pytest.raises(StateDirInUse, match=rf"{tmp_path / 'state'} is in use by another embedded Redis "
                                                rf"\(server pid {os.getpid()}\)"):
            second.start()
        first.stop()
        assert connect(second.start(), 1.0).ping()  # free once the first one is stopped
    finally:
        first.close()
        second.close()


def test_the_memory_cap_evicts_only_keys_that_expire(tmp_path: Path) -> None:
    """Unbounded anonymous writes used to grow the embedded Redis without limit."""
    server = EmbeddedRedis(tmp_path / "s", maxmemory_mb=2, maxmemory_policy="volatile-lru")
    try:
        client = connect(server.start(), 1.0)
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "volatile-lru"}
        client.set("ns:versions:rules:active", "v1")  # no TTL: never evicted
        blob = "x" * 2_000
        for n in range(3_000):  # ~6 MB of expiring keys into a 2 MB server
            client.set(f"ns:hist:fake-{n}", blob, ex=3600)
        assert int(client.info("memory")["used_memory"]) <= 2 * 1024 * 1024 * 1.1
        assert client.get("ns:versions:rules:active") == b"v1"
        assert client.dbsize() < 3_000
        with pytest.raises(redis.exceptions.OutOfMemoryError):  # nothing expiring left to evict
            for n in range(3_000):
                client.set(f"ns:pinned-{n}", blob)
    finally:
        server.close()


def test_a_policy_that_could_evict_versions_is_refused() -> None:
    with pytest.raises(ValueError, match="volatile-lru or volatile-ttl"):
        EmbeddedRedis(maxmemory_policy="allkeys-lru")  # type: ignore[arg-type]


_CHILD = """
import sys, threading, time
from recsys.redis_server import EmbeddedRedis
server = EmbeddedRedis(sys.argv[1], supervise=True, data_dir=sys.argv[2])
starter = threading.Thread(target=server.start)  # a thread that ends: the server must outlive it
starter.start(); starter.join()
print(server.proc.pid, flush=True)
time.sleep(120)
"""


def test_the_embedded_redis_dies_with_a_sigkilled_parent_not_with_the_thread_that_started_it(tmp_path: Path) -> None:
    """``kill -9`` of the server used to leave redis-server running (its own session, no one to stop it)."""
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path / "s"), str(tmp_path / "state")],
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        assert proc.stdout is not None
        pid = int(proc.stdout.readline())
        time.sleep(0.5)  # the starting thread has ended by now
        assert _alive(pid), "redis-server died with the thread that started it"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert _wait_for(lambda: not _alive(pid)), f"redis-server {pid} outlived its SIGKILLed parent"
    finally:
        proc.kill()
        proc.wait()
