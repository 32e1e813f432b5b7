from __future__ import annotations

import uuid

import numpy as np
import pytest
import redis

from recsys.redis_client import RedisGuard, RedisUnavailable
from serving.catalog_state import SplitHistories
from serving.online_state import OnlineState


@pytest.fixture
def state(redis_env: str) -> OnlineState:
    client = redis.Redis.from_url(redis_env)
    seeds = SplitHistories([np.array([5, 6, 7, 8], dtype=np.int64), np.array([1], dtype=np.int64)])
    return OnlineState(client, RedisGuard(), f"t-{uuid.uuid4().hex}", seeds,
                       history_max_len=3, stream_maxlen=100, dedup_ttl_s=60)


def test_history_is_seeded_lazily_capped_and_appended(state: OnlineState) -> None:
    hist, version = state.history("alice", 0)
    assert hist.tolist() == [6, 7, 8] and version == 0  # last history_max_len=3 split items
    res = state.ingest("e1", "alice", 0, 9, {"type": "click"})
    assert (res.status, res.history_version) == ("accepted", 1)
    hist, version = state.history("alice", 0)
    assert hist.tolist() == [7, 8, 9] and version == 1


def test_event_before_first_read_seeds_then_appends(state: OnlineState) -> None:
    state.ingest("e1", "bob", 1, 4, {"type": "rating"})
    assert state.history("bob", 1)[0].tolist() == [1, 4]
    state.ingest("e2", "stranger", None, 3, {"type": "purchase"})  # unknown user: no seed
    assert state.history("stranger", None) == (pytest.approx(np.array([3])), 1)


def test_duplicate_event_is_ignored_and_impression_leaves_history(state: OnlineState) -> None:
    first = state.ingest("dup", "bob", 1, 4, {"type": "click"})
    again = state.ingest("dup", "bob", 1, 4, {"type": "click"})
    assert (again.status, again.history_version, again.stream_id) == ("duplicate", None, None)
    seen = state.ingest("imp", "bob", 1, None, {"type": "impression", "item_id": "m9"})
    assert seen.status == "accepted" and seen.history_version is None
    assert state.history("bob", 1) [0].tolist() == [1, 4]
    entries = state.client.xrange(f"{state.ns}:events")
    assert [e[0].decode() for e in entries] == [first.stream_id, seen.stream_id]
    assert entries[1][1] == {b"seq": b"2", b"type": b"impression", b"item_id": b"m9"}  # numbered in order


def test_result_cache_round_trip_and_expiry(state: OnlineState) -> None:
    assert state.cached_result("k") is None
    state.store_result("k", {"items": [1]}, ttl_s=60)
    assert state.cached_result("k") == {"items": [1]}
    assert 0 < state.client.pttl(f"{state.ns}:result:k") <= 60_000


def test_calls_raise_unavailable_when_redis_is_gone(redis_server, state: OnlineState) -> None:
    redis_server.stop()
    try:
        with pytest.raises(RedisUnavailable):
            state.history("alice", 0)
        with pytest.raises(RedisUnavailable, match="next retry"):
            state.cached_result("k")  # in backoff: no connection attempt at all
    finally:
        redis_server.start()


def test_reading_unknown_users_writes_no_key(state: OnlineState) -> None:
    """A read of a new user id leaves no key behind (no permanent ``hver`` key per stranger)."""
    for n in range(50):
        assert state.history(f"stranger-{n}", None) == (pytest.approx(np.zeros(0)), 0)
    assert state.client.keys(f"{state.ns}:*") == []
    state.history("alice", 0)  # a known user is still seeded (bounded by the catalog)
    assert sorted(state.client.keys(f"{state.ns}:*")) == [f"{state.ns}:hist:alice".encode(),
                                                           f"{state.ns}:hver:alice".encode()]
    state.ingest("e1", "stranger-7", None, 3, {"type": "click"})  # an event makes the user's history real
    assert state.history("stranger-7", None) == (pytest.approx(np.array([3])), 1)


def test_unknown_users_history_expires_after_their_last_event(redis_env: str) -> None:
    """An event from an id the split does not know creates keys that expire; a known user's do not."""
    client = redis.Redis.from_url(redis_env)
    seeds = SplitHistories([np.array([5, 6], dtype=np.int64)])
    state = OnlineState(client, RedisGuard(), f"t-{uuid.uuid4().hex}", seeds, history_max_len=3,
                        stream_maxlen=100, dedup_ttl_s=60, unknown_history_ttl_s=120)
    state.ingest("e1", "stranger", None, 3, {"type": "click"})
    state.ingest("e2", "alice", 0, 4, {"type": "click"})
    state.ingest("e4", "short", None, 4, {"type": "click"}, known=True)  # outside the split, not a stranger
    for key in ("hist", "hver"):
        assert 0 < client.ttl(f"{state.ns}:{key}:stranger") <= 120
        assert client.ttl(f"{state.ns}:{key}:alice") == client.ttl(f"{state.ns}:{key}:short") == -1  # no expiry
    client.expire(f"{state.ns}:hist:stranger", 5)
    client.expire(f"{state.ns}:hver:stranger", 5)
    state.ingest("e3", "stranger", None, 8, {"type": "click"})  # each event renews it
    assert client.ttl(f"{state.ns}:hver:stranger") > 5
    assert state.history("stranger", None)[0].tolist() == [3, 8]


def test_the_stream_counts_what_it_was_given_so_a_trimmed_one_is_told(redis_env: str) -> None:
    """`ab analyze` says when MAXLEN has trimmed the stream, rather than silently read what is left."""
    from jobs.ab.events import read_stream
    from jobs.ab.integrity import integrity_warning, stream_integrity

    client = redis.Redis.from_url(redis_env)
    ns = f"t-{uuid.uuid4().hex}"
    seeds = SplitHistories([np.array([0, 1])])
    state = OnlineState(client, RedisGuard(), ns, seeds, history_max_len=3, stream_maxlen=1_000, dedup_ttl_s=60)
    state.ingest("e0", "u0", 0, 2, {"user_id": "u0", "item_id": "i2", "type": "click"})
    state.log_impressions([{"user_id": "u0", "item_id": "i3", "type": "impression"}] * 2)
    whole = stream_integrity(client, ns, read_stream(client, ns))
    assert (whole["accepted"], whole["held"], whole["missing"]) == (3, 3, 0)
    assert integrity_warning(ns, whole) is None
    small = OnlineState(client, RedisGuard(), ns, seeds, history_max_len=3, stream_maxlen=1, dedup_ttl_s=60)
    for n in range(300):  # MAXLEN ~ trims whole radix-tree nodes (100 entries each), so go past one
        small.log_impressions([{"user_id": "u0", "item_id": "i3", "type": "impression", "n": str(n)}])
    log = read_stream(client, ns)
    held = len(log)
    assert held < 303 and log["seq"].tolist() == list(range(304 - held, 304))
    counts = stream_integrity(client, ns, log)
    assert (counts["accepted"], counts["trimmed"], counts["lost"], counts["unexplained"]) == (303, 303 - held, 0, 0)
    assert integrity_warning(ns, counts) == (
        f"{ns}:events holds {held:,} of the 303 events serving accepted; {303 - held:,} are missing: "
        f"{303 - held:,} trimmed, the oldest, by the stream's length cap (serving.events_stream_maxlen; raise it, "
        "or export the log with --export more often). This analysis covers only the events held")
