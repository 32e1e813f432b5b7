"""Events survive a crash of the embedded Redis, and the events that do not are counted and told."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import redis

from jobs.ab.events import read_stream
from jobs.ab.integrity import integrity_warning, stream_integrity
from recsys.event_ledger import LedgerWriter, advance, read_acknowledged
from recsys.redis_client import RedisGuard, connect
from recsys.redis_server import EmbeddedRedis
from serving.catalog_state import SplitHistories
from serving.online_state import OnlineState


def _state(client: redis.Redis, ns: str = "shop", ledger: LedgerWriter | None = None) -> OnlineState:
    seeds = SplitHistories([np.array([0, 1], dtype=np.int64)])
    return OnlineState(client, RedisGuard(min_s=0.01, max_s=0.05), ns, seeds, history_max_len=50,
                       stream_maxlen=100_000, dedup_ttl_s=600, ledger=ledger)


def _send(state: OnlineState, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        state.ingest(f"e{i}", f"user-{i % 40}", None, i % 7, {"user_id": f"user-{i % 40}", "type": "click"})


def _wait_for(check: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def test_events_outlive_a_kill_9_of_the_embedded_redis(tmp_path: Path) -> None:
    """1,600 events, ``kill -9`` of redis-server: the supervised restart reloads every one of them."""
    server = EmbeddedRedis(tmp_path / "sock", supervise=True, data_dir=tmp_path / "state")
    try:
        client = connect(server.start(), 1.0)
        state = _state(client)
        _send(state, 1_600)
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGKILL)
        assert _wait_for(lambda: server.restarts == 1)
        client.connection_pool.disconnect()
        log = read_stream(client, "shop")
        counts = stream_integrity(client, "shop", log)
        assert (len(log), counts["accepted"], counts["missing"]) == (1_600, 1_600, 0)
        assert integrity_warning("shop", counts) is None
        _send(state, 1, start=1_600)  # numbering goes on where it stopped
        assert read_stream(client, "shop")["seq"].max() == 1_601
    finally:
        server.close()


def test_a_redis_that_comes_back_empty_is_told_with_the_count(tmp_path: Path) -> None:
    """A restarted Redis without its file used to read as a short, healthy log: `"warnings": []`."""
    server = EmbeddedRedis(tmp_path / "sock")  # nothing on disk: a restart loses everything
    try:
        client = connect(server.start(), 1.0)
        state = _state(client)
        _send(state, 120)
        server.stop()
        server.start()
        client.connection_pool.disconnect()
        assert state.reconcile() == 120  # the first check after the restart records the range
        assert state.reconcile() == 0  # once
        _send(state, 5, start=120)
        log = read_stream(client, "shop")
        assert log["seq"].tolist() == [121, 122, 123, 124, 125]  # never a number given twice
        counts = stream_integrity(client, "shop", log)
        assert (counts["accepted"], counts["held"], counts["lost"], counts["trimmed"]) == (125, 5, 120, 0)
        assert [(r["from"], r["to"]) for r in counts["lost_ranges"]] == [(1, 120)]
        warning = integrity_warning("shop", counts)
        assert warning is not None and warning.startswith(
            "shop:events holds 5 of the 125 events serving accepted; 120 are missing: 120 lost when Redis came "
            "back without them (#1-#120;")
    finally:
        server.close()


def test_the_ledger_counts_what_a_reset_redis_lost_before_any_server_ran_again(tmp_path: Path) -> None:
    """Redis restored from an older file: the stream is consistent, only the ledger knows it is short."""
    ledger_file = tmp_path / "state" / "events-ledger.json"
    server = EmbeddedRedis(tmp_path / "sock")
    try:
        client = connect(server.start(), 1.0)
        state = _state(client, ledger=LedgerWriter(ledger_file, "shop", every_s=0.0))
        _send(state, 30)
        assert read_acknowledged(ledger_file, "shop") == 30
        client.flushall()
        _state(client).log_impressions([{"user_id": "u", "type": "impression"}] * 4)  # another worker, no floor
        counts = stream_integrity(client, "shop", read_stream(client, "shop"), acknowledged=30)
        assert (counts["accepted"], counts["held"], counts["not_in_redis"], counts["missing"]) == (30, 4, 26, 26)
        assert "26 acknowledged by serving (its ledger reaches #30)" in (integrity_warning("shop", counts) or "")
        restarted = _state(client)  # a server starting on the ledger records the range at once
        restarted.raise_floor(read_acknowledged(ledger_file, "shop"))
        assert restarted.reconcile() == 26
    finally:
        server.close()


def test_the_ledger_never_goes_down_and_names_a_damaged_file(tmp_path: Path) -> None:
    path = tmp_path / "events-ledger.json"
    assert read_acknowledged(path, "a") == 0
    assert advance(path, "a", 10) == 10 and advance(path, "a", 4) == 10 and advance(path, "b", 3) == 3
    assert (read_acknowledged(path, "a"), read_acknowledged(path, "b")) == (10, 3)
    path.write_text("{not json")
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: not an events ledger"):
        read_acknowledged(path, "a")
