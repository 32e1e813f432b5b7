"""Where written reasons are kept: the serving layer's Redis (with a TTL), or this process.

Keys are ``<prompt version>|<history digest>|<item>`` (``llm_rerank.explain.ReasonWriter``), so a
reason is served again only for the same item, the same history window, the same model and the
same prompt texts. With Redis (``RedisReasonCache``) every worker and the batch job that
precomputes reasons (``recsys tag explanations``) share them; entries are JSON under
``<namespace>:reason:<key>`` and expire after ``ExplainConfig.cache_ttl_s``. Without one
(``MemoryReasonCache``) an LRU with the same TTL serves one process. A Redis that fails is a miss
(and a write skipped), never an error: a reason is always served, from the template at worst.

Deliberately left out: what a reason is and when it is written (``llm_rerank.explain``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from recsys.redis_client import RedisGuard, RedisUnavailable

log = logging.getLogger(__name__)


class ReasonCache(Protocol):
    """Reasons by key; called by ``ReasonWriter.write`` once per request (one read, one write)."""

    def get_many(self, keys: Sequence[str]) -> list[dict[str, Any] | None]: ...

    def put_many(self, entries: Mapping[str, dict[str, Any]]) -> None: ...


class MemoryReasonCache:
    """In-process LRU of ``capacity`` reasons, each kept ``ttl_s`` seconds; thread-safe."""

    def __init__(self, capacity: int, ttl_s: float, clock: Callable[[], float] = time.monotonic):
        self.capacity, self.ttl_s, self.clock = capacity, ttl_s, clock
        self._data: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def get_many(self, keys: Sequence[str]) -> list[dict[str, Any] | None]:
        now = self.clock()
        out: list[dict[str, Any] | None] = []
        with self._lock:
            for key in keys:
                hit = self._data.get(key)
                if hit is not None and hit[0] > now:
                    self._data.move_to_end(key)
                    out.append(dict(hit[1]))
                else:
                    self._data.pop(key, None)
                    out.append(None)
        return out

    def put_many(self, entries: Mapping[str, dict[str, Any]]) -> None:
        if self.capacity <= 0 or self.ttl_s <= 0:
            return
        expires = self.clock() + self.ttl_s
        with self._lock:
            for key, value in entries.items():
                self._data[key] = (expires, dict(value))
                self._data.move_to_end(key)
            while len(self._data) > self.capacity:
                self._data.popitem(last=False)

    def clear(self) -> None:
        """Forget every reason (a benchmark's cold start)."""
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)


class RedisReasonCache:
    """Reasons in Redis under ``<namespace>:reason:``; ``client`` is the serving layer's connection."""

    def __init__(self, client: Any, namespace: str, ttl_s: float, guard: RedisGuard | None = None):
        self.client, self.prefix, self.ttl_s = client, f"{namespace}:reason:", ttl_s
        self.guard = guard or RedisGuard()

    def get_many(self, keys: Sequence[str]) -> list[dict[str, Any] | None]:
        if not keys:
            return []
        try:
            raw = self.guard.call(lambda: self.client.mget([self.prefix + k for k in keys]))
        except RedisUnavailable as exc:
            log.debug("reason cache read skipped: %s", exc)
            return [None] * len(keys)
        out: list[dict[str, Any] | None] = []
        for blob in raw:
            try:
                value = None if blob is None else json.loads(blob)
            except (TypeError, ValueError):  # not written by us: a miss, rewritten on the next write
                value = None
            out.append(value if isinstance(value, dict) and {"text", "source"} <= set(value) else None)
        return out

    def put_many(self, entries: Mapping[str, dict[str, Any]]) -> None:
        if not entries or self.ttl_s <= 0:
            return
        px = max(1, int(self.ttl_s * 1000))

        def write() -> None:
            pipe = self.client.pipeline(transaction=False)
            for key, value in entries.items():
                pipe.set(self.prefix + key, json.dumps(value, separators=(",", ":")), px=px)
            pipe.execute()

        try:
            self.guard.call(write)
        except RedisUnavailable as exc:
            log.debug("reason cache write skipped: %s", exc)
