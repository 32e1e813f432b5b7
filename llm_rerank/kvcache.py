"""Block-hashed prefix cache bookkeeping with two tiers: in-process LRU and shared Redis.

A prompt is cut into fixed-size token blocks; block i is keyed by
``sha256(key of block i-1 || tokens of block i)`` (the chain starts from a namespace, e.g. the
model version), as in vLLM's automatic prefix caching (Kwon et al. 2023). A key therefore
identifies the whole prefix up to the end of its block: any shared prefix (the instruction
for everyone, the profile + history for one user) is found block by block, and a changed
token changes the key of its block and of every block after it. Only full blocks are keyed.

- ``Tier1``: in-process LRU bounded in bytes (values are whatever the runtime stores, with
  their size given by the caller).
- ``RedisTier``: shared by worker processes and surviving their restarts; every block key
  has a TTL and lives on a dedicated key prefix; a sorted set of last-use times bounds the
  number of blocks (oldest evicted). Any Redis failure is counted and answered as a miss
  (a recomputation), never raised; ``RedisGuard`` skips a dead Redis for a backoff.
- ``TwoTierCache``: the longest cached chain of blocks, tier 1 first, tier-2 hits promoted.

Counters: every cache keeps its own (``TwoTierCache.stats``) and also adds them to
``PROCESS_COUNTS``, one monotonic total per process over every cache it ever built (a
reloaded stage's new cache keeps counting where the old one stopped), which
``serving.metrics`` turns into Prometheus counters. A lookup is classed by how much of the
prefix it found: ``full`` (every block), ``partial`` or ``miss`` (none).

Deliberately left out: anything about tensors or models (``llm_rerank.prefix_kv`` encodes
KV blocks and runs the model); eviction of blocks in the middle of a chain is harmless
(lookup stops at the first missing block).
"""

from __future__ import annotations

import hashlib
import logging
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import redis

from recsys.redis_client import RedisGuard, RedisUnavailable

log = logging.getLogger(__name__)

LOOKUP_OUTCOMES = ("full", "partial", "miss")
COUNTER_NAMES = (
    "lookups", *(f"lookups_{o}" for o in LOOKUP_OUTCOMES), "blocks_requested", "tier1_hits", "tier2_hits",
    "misses", "stored", "tier2_bytes_read", "tier2_bytes_written", "tier1_evictions", "tier2_evictions",
    "tier2_errors",
)


class ProcessCounts:
    """Monotonic per-process totals of every prefix cache's counters; thread-safe.

    >>> c = ProcessCounts(); c.add(lookups=1, tier1_hits=3); c.snapshot()["tier1_hits"]
    3
    """

    def __init__(self) -> None:
        self._counts = dict.fromkeys(COUNTER_NAMES, 0)
        self._lock = threading.Lock()

    def add(self, **deltas: int) -> None:
        unknown = set(deltas) - set(self._counts)
        if unknown:
            raise ValueError(f"unknown prefix-cache counter(s) {sorted(unknown)}; known: {list(COUNTER_NAMES)}")
        with self._lock:
            for name, n in deltas.items():
                self._counts[name] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


PROCESS_COUNTS = ProcessCounts()


def block_keys(tokens: Sequence[int], block_tokens: int, namespace: str = "") -> list[str]:
    """Chained hex keys of the full ``block_tokens``-sized blocks of ``tokens``.

    >>> len(block_keys(range(40), 16))
    2
    """
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    parent = hashlib.sha256(namespace.encode()).digest()
    keys = []
    for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
        block = tokens[start : start + block_tokens]
        parent = hashlib.sha256(parent + struct.pack(f"<{len(block)}q", *block)).digest()
        keys.append(parent.hex()[:32])
    return keys


class Tier1:
    """LRU map bounded in total bytes (a value larger than the bound is not stored); thread-safe."""

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"Tier1: max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.bytes = 0
        self.evictions = 0
        self._data: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()  # serving threads share one stage

    def get(self, key: str) -> Any | None:
        with self._lock:
            hit = self._data.get(key)
            if hit is None:
                return None
            self._data.move_to_end(key)
            return hit[0]

    def put(self, key: str, value: Any, nbytes: int) -> None:
        if nbytes > self.max_bytes:
            return
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            self._data[key] = (value, nbytes)
            self.bytes += nbytes
            evicted = 0
            while self.bytes > self.max_bytes:
                _, (_, size) = self._data.popitem(last=False)
                self.bytes -= size
                evicted += 1
            self.evictions += evicted
        if evicted:
            PROCESS_COUNTS.add(tier1_evictions=evicted)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.bytes = 0

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: str) -> bool:
        return key in self._data


class RedisTier:
    """Blocks as Redis strings ``<prefix><key>`` with a TTL; ``<prefix>lru`` (zset) bounds their number."""

    def __init__(self, client: Any, *, prefix: str = "llmkv:", ttl_s: int = 3600, max_entries: int = 50_000,
                 guard: Any = None, clock: Callable[[], float] = time.time):

        self.client = client
        self.prefix, self.ttl_s, self.max_entries = prefix, ttl_s, max_entries
        self.guard = guard or RedisGuard(min_s=0.5, max_s=10.0)
        self.clock = clock
        self.errors = 0
        self.evictions = 0

    def _call(self, fn: Callable[[], Any]) -> Any:


        try:
            return self.guard.call(fn)
        except (RedisUnavailable, redis.exceptions.RedisError) as exc:
            self.errors += 1
            PROCESS_COUNTS.add(tier2_errors=1)
            log.debug("tier-2 KV cache unavailable: %s", exc)
            return None

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """Values for ``keys`` (None where missing or Redis failed); hits get their TTL and LRU time renewed."""
        if not keys:
            return []
        values = self._call(lambda: self.client.mget([self.prefix + k for k in keys]))
        if values is None:
            return [None] * len(keys)
        hits = [k for k, v in zip(keys, values, strict=True) if v is not None]
        if hits:
            def touch() -> None:
                pipe = self.client.pipeline(transaction=False)
                for k in hits:
                    pipe.expire(self.prefix + k, self.ttl_s)
                pipe.zadd(self.prefix + "lru", dict.fromkeys(hits, self.clock()))
                pipe.execute()
            self._call(touch)
        return list(values)

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Store blocks, then evict the least recently used beyond ``max_entries``."""
        if not items:
            return

        def write() -> None:
            pipe = self.client.pipeline(transaction=False)
            for k, v in items:
                pipe.set(self.prefix + k, v, ex=self.ttl_s)
            pipe.zadd(self.prefix + "lru", {k: self.clock() for k, _ in items})
            pipe.zcard(self.prefix + "lru")
            size = pipe.execute()[-1]
            excess = int(size) - self.max_entries
            if excess > 0:
                old = [m.decode() if isinstance(m, bytes) else m
                       for m, _ in self.client.zpopmin(self.prefix + "lru", excess)]
                if old:
                    self.client.delete(*[self.prefix + k for k in old])
                self.evictions += len(old)
                PROCESS_COUNTS.add(tier2_evictions=len(old))
        self._call(write)


class TwoTierCache:
    """Longest cached chain of blocks across tier 1 and tier 2, with counters (``stats``).

    ``encode(value) -> bytes`` / ``decode(bytes) -> value`` convert for tier 2 and
    ``size(value) -> int`` measures a tier-1 value.
    """

    def __init__(self, tier1: Tier1, tier2: RedisTier | None, *, encode: Callable[[Any], bytes],
                 decode: Callable[[bytes], Any], size: Callable[[Any], int]):
        self.tier1, self.tier2 = tier1, tier2
        self.encode, self.decode, self.size = encode, decode, size
        self.counts = {"lookups": 0, **{f"lookups_{o}": 0 for o in LOOKUP_OUTCOMES}, "blocks_requested": 0,
                       "tier1_hits": 0, "tier2_hits": 0, "misses": 0, "stored": 0, "tier2_bytes_read": 0,
                       "tier2_bytes_written": 0}
        self._lock = threading.Lock()

    def lookup(self, keys: Sequence[str]) -> list[Any]:
        """Values of the longest run ``keys[:n]`` that is cached (tier 1, else tier 2)."""
        found: list[Any] = []
        for key in keys:
            value = self.tier1.get(key)
            if value is None:
                break
            found.append(value)
        tier1_hits, tier2_hits, bytes_read = len(found), 0, 0
        rest = list(keys[len(found):])
        if rest and self.tier2 is not None:
            for key, raw in zip(rest, self.tier2.get_many(rest), strict=True):
                if raw is None:
                    break
                value = self.decode(raw)
                self.tier1.put(key, value, self.size(value))  # promote
                found.append(value)
                tier2_hits += 1
                bytes_read += len(raw)
        outcome = "full" if keys and len(found) == len(keys) else "partial" if found else "miss"
        self._count(lookups=1, **{f"lookups_{outcome}": 1}, blocks_requested=len(keys), tier1_hits=tier1_hits,
                    tier2_hits=tier2_hits, tier2_bytes_read=bytes_read, misses=len(keys) - len(found))
        return found

    def store(self, items: Sequence[tuple[str, Any]]) -> None:
        """Put freshly computed blocks in both tiers."""
        for key, value in items:
            self.tier1.put(key, value, self.size(value))
        written = 0
        if self.tier2 is not None and items:
            raw = [(k, self.encode(v)) for k, v in items]
            written = sum(len(b) for _, b in raw)
            self.tier2.put_many(raw)
        self._count(stored=len(items), tier2_bytes_written=written)

    def _count(self, **deltas: int) -> None:
        with self._lock:  # concurrent requests share one stage and so one cache
            for name, n in deltas.items():
                self.counts[name] += n
        PROCESS_COUNTS.add(**deltas)

    def clear_tier1(self) -> None:
        self.tier1.clear()

    def stats(self) -> dict[str, float]:
        """Counters for serving metrics: lookups, hits per tier, bytes, evictions, errors."""
        requested = self.counts["blocks_requested"]
        hits = self.counts["tier1_hits"] + self.counts["tier2_hits"]
        return {**{k: float(v) for k, v in self.counts.items()},
                "hit_rate": hits / requested if requested else 0.0,
                "tier1_entries": float(len(self.tier1)), "tier1_bytes": float(self.tier1.bytes),
                "tier1_evictions": float(self.tier1.evictions),
                "tier2_evictions": float(self.tier2.evictions if self.tier2 else 0),
                "tier2_errors": float(self.tier2.errors if self.tier2 else 0)}
