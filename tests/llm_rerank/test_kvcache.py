"""Block-hash bookkeeping and the two cache tiers (real embedded Redis), without any model."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from llm_rerank.kvcache import RedisTier, Tier1, TwoTierCache, block_keys
from recsys.redis_server import EmbeddedRedis


def test_same_prefix_same_keys_and_one_changed_token_changes_every_later_key() -> None:
    a = list(range(100))
    b = a[:40] + [999] + a[41:]  # token 40 sits in block 2 (tokens 32..47)
    ka, kb = block_keys(a, 16), block_keys(b, 16)
    assert len(ka) == 6  # 100 // 16 full blocks; the 4-token tail is not keyed
    assert ka[:2] == kb[:2]
    assert all(x != y for x, y in zip(ka[2:], kb[2:], strict=True))
    assert block_keys(a[:50], 16) == ka[:3]  # a shorter prompt with the same start
    assert block_keys(a, 16, namespace="other model")[0] != ka[0]
    # the same block content after a different parent gets another key (chained, not per block)
    assert block_keys(a[16:32] + a[16:32], 16)[1] != block_keys(a[:32], 16)[1]
    with pytest.raises(ValueError, match="block_tokens"):
        block_keys(a, 0)


def test_tier1_is_lru_and_bounded_in_bytes() -> None:
    t = Tier1(max_bytes=100)
    t.put("a", "A", 40)
    t.put("b", "B", 40)
    assert t.get("a") == "A"  # a is now the most recent
    t.put("c", "C", 40)  # 120 > 100: evicts b, the least recently used
    assert "b" not in t and t.get("a") == "A" and t.get("c") == "C"
    assert t.bytes == 80 and t.evictions == 1
    t.put("huge", "H", 101)  # larger than the whole bound: not stored, nothing evicted
    assert "huge" not in t and len(t) == 2
    t.put("a", "A2", 10)  # replacing re-counts the size
    assert t.bytes == 50 and t.get("a") == "A2"


@pytest.fixture()
def embedded() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis()
    server.start()
    yield server
    server.stop()


def _cache(client: redis.Redis, tier1_bytes: int = 1000, **kw: object) -> TwoTierCache:
    tier2 = RedisTier(client, prefix="t:", **kw)  # type: ignore[arg-type]
    return TwoTierCache(Tier1(tier1_bytes), tier2, encode=str.encode, decode=bytes.decode, size=len)


def test_two_tiers_share_blocks_promote_and_bound_entries(embedded: EmbeddedRedis) -> None:
    client = redis.Redis.from_url(embedded.url)
    worker_a, worker_b = _cache(client, max_entries=3), _cache(client, max_entries=3)
    keys = block_keys(range(64), 16)
    worker_a.store([(k, f"kv{i}") for i, k in enumerate(keys[:2])])
    assert worker_b.lookup(keys) == ["kv0", "kv1"]  # computed by another worker: found in tier 2
    assert worker_b.lookup(keys) == ["kv0", "kv1"]  # now promoted to b's tier 1
    s = worker_b.stats()
    assert (s["tier2_hits"], s["tier1_hits"], s["misses"], s["lookups"]) == (2, 2, 4, 2)
    assert s["hit_rate"] == pytest.approx(4 / 8) and s["tier2_bytes_read"] == 6
    assert client.ttl("t:" + keys[0]) > 0  # every block expires
    worker_a.store([(k, "x") for k in keys[2:]] + [("extra", "y")])  # 5 blocks > max_entries 3
    assert client.zcard("t:lru") == 3 and worker_a.tier2 is not None and worker_a.tier2.evictions == 2
    assert client.get("t:" + keys[0]) is None  # least recently used went first


def test_tier2_loss_costs_only_a_miss(embedded: EmbeddedRedis) -> None:
    client = redis.Redis.from_url(embedded.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    cache = _cache(client, tier1_bytes=0)  # no tier 1: everything depends on Redis
    keys = block_keys(range(32), 16)
    cache.store([(keys[0], "kv0")])
    assert cache.lookup(keys) == ["kv0"]
    embedded.stop()
    assert cache.lookup(keys) == []  # Redis gone: a miss, no exception
    cache.store([(keys[1], "kv1")])  # writes are dropped quietly too
    assert cache.stats()["tier2_errors"] >= 1
