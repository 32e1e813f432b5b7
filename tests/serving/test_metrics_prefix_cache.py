"""``/metrics`` counts the LLM prefix cache: lookups by outcome, blocks by tier, evictions, bytes.

The counts come from real ``llm_rerank.kvcache`` caches (and one real ``BlockPrefixCache`` on a
tiny random Llama of SmolLM2's architecture); the expected figures are worked out by hand.
"""

from __future__ import annotations

import redis

from llm_rerank.kvcache import RedisTier, Tier1, TwoTierCache, block_keys
from llm_rerank.prefix_kv import BlockPrefixCache
from llm_rerank.prompt import PromptBuilder
from serving.metrics import ServingMetrics, llm_cache_counts
from tests.llm_rerank.factories import ANIMATION, HORROR, tiny_llm


def cache(max_bytes: int = 1000, tier2: RedisTier | None = None) -> TwoTierCache:
    return TwoTierCache(Tier1(max_bytes), tier2, encode=lambda v: v.encode(), decode=lambda b: b.decode(),
                        size=len)


def scrape(metrics: ServingMetrics) -> dict[str, float]:
    return llm_cache_counts(metrics.render().decode())


def test_lookups_by_outcome_and_blocks_by_tier_by_hand() -> None:
    metrics = ServingMetrics()
    c = cache()
    keys = block_keys(range(48), 16, "ns")  # 3 blocks
    assert c.lookup(keys) == []  # miss: 3 blocks missing
    c.store([(k, f"v{i}") for i, k in enumerate(keys)])
    assert c.lookup(keys) == ["v0", "v1", "v2"]  # full: 3 tier-1 hits
    other = keys[:2] + block_keys(range(64), 16, "other")[2:]  # shares the first two blocks only
    assert c.lookup(other) == ["v0", "v1"]  # partial: 2 hits, 2 misses
    got = scrape(metrics)
    assert (got["lookups_full"], got["lookups_partial"], got["lookups_miss"], got["lookups"]) == (1, 1, 1, 3)
    assert (got["tier1_hits"], got["tier2_hits"], got["misses"], got["blocks_requested"]) == (5, 0, 5, 10)
    assert got["stored"] == 3 and got["tier1_evictions"] == 0


def test_a_new_app_counts_from_its_creation_and_a_scrape_is_stable() -> None:
    c = cache()
    c.lookup(block_keys(range(32), 16))  # before the app: not its lookups
    metrics = ServingMetrics()
    c.lookup(block_keys(range(16), 16))
    assert scrape(metrics)["lookups_miss"] == 1
    assert scrape(metrics)["lookups_miss"] == 1  # a second scrape adds nothing


def test_tier1_evictions_and_tier2_hits_and_bytes(redis_env: str) -> None:
    metrics = ServingMetrics()
    client = redis.Redis.from_url(redis_env)  # the session's embedded Redis (tests/serving/conftest.py)
    tier2 = RedisTier(client, prefix="mtest:")
    c = cache(max_bytes=4, tier2=tier2)  # tier 1 holds two 2-byte values
    keys = block_keys(range(48), 16, "evict")
    c.store([(keys[0], "aa"), (keys[1], "bb"), (keys[2], "cc")])  # the third evicts the first from tier 1
    assert c.lookup(keys) == ["aa", "bb", "cc"]  # keys[0] missing in tier 1: the whole chain from tier 2
    got = scrape(metrics)
    # store: cc evicts aa; promoting aa, bb, cc back from tier 2 evicts bb, cc, aa in turn
    assert (got["tier1_evictions"], got["tier2_evictions"]) == (4, 0)
    assert (got["tier1_hits"], got["tier2_hits"], got["lookups_full"]) == (0, 3, 1)
    assert got["tier2_bytes_written"] == 6 and got["tier2_bytes_read"] == 6


def test_tier2_errors_are_counted() -> None:
    metrics = ServingMetrics()
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.05)
    c = cache(tier2=RedisTier(dead, prefix="dead:"))
    assert c.lookup(block_keys(range(16), 16, "dead")) == []
    assert scrape(metrics)["tier2_errors"] == 1


def test_block_prefix_cache_of_a_real_model_shows_the_warm_hit() -> None:
    model, tok = tiny_llm()
    metrics = ServingMetrics()
    blocks = BlockPrefixCache.build(model, block_tokens=16, namespace="metrics-test")
    prompt = PromptBuilder(tok).pointwise(HORROR[:4], {"age": 30}, ANIMATION[:3]).prefix
    n = len(prompt) // 16
    blocks.state(prompt)
    cold = scrape(metrics)
    assert (cold["lookups_miss"], cold["misses"], cold["stored"]) == (1, n, n)
    blocks.state(prompt)
    warm = scrape(metrics)
    assert (warm["lookups_full"], warm["tier1_hits"] - cold["tier1_hits"], warm["stored"]) == (1, n, n)


def test_exposition_names_the_series() -> None:
    text = ServingMetrics().render().decode()
    for name in ("recsys_llm_prefix_cache_lookups", "recsys_llm_prefix_cache_blocks",
                 "recsys_llm_prefix_cache_evictions", "recsys_llm_prefix_cache_tier2_errors"):
        assert f"# TYPE {name}_total counter" in text or f"# TYPE {name} counter" in text
