"""The online state in Redis: per-user recent histories, the event stream, the result cache.

Keys, all under the namespace ``ns`` (``serving.redis_namespace`` or the dataset name):

- ``{ns}:hist:{user_id}``: the user's most recent item indices, oldest first, capped at
  ``history_max_len``; seeded lazily from the split's history the first time a known user is
  seen, created for an unknown user only by that user's first history event;
- ``{ns}:hver:{user_id}``: the history version, bumped by every appended event (its presence
  also marks the list as seeded); result cache keys include it, so an event invalidates that
  user's cached answers without deleting anything. Reading an unknown user writes nothing
  (empty history, version 0): read traffic with made-up ids must not grow Redis, so per-user
  keys exist only for the split's users and for users who sent events;
- ``{ns}:events``: the event stream (``XADD ... MAXLEN ~ events_stream_maxlen``), also holding
  the impressions an active experiment logs (``log_impressions``);
- ``{ns}:events:added``: how many entries were ever added to the stream (``INCR`` beside each
  ``XADD``), so `recsys ab analyze` can tell when trimming dropped the oldest;
- ``{ns}:seen:{event_id}``: duplicate guard (``SET NX EX event_dedup_ttl_s``);
- ``{ns}:result:{digest}``: cached answers (``SETEX``), see ``serving.policy.result_cache_key``.

Seeding, dedup, XADD and the history append run inside Lua scripts, so two workers seeding
the same user, or a crash between two writes, cannot duplicate or lose half an event.
Every call goes through the worker's ``RedisGuard`` and raises ``RedisUnavailable`` when Redis
is down; ``serving.service`` then serves from the split's in-memory histories (degraded).

The history of a user the split does not know expires ``unknown_history_ttl_s`` after their
last event (``EXPIRE`` on both keys, renewed by each event); a known user's never does.

Deliberately left out: consumers of the event stream.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis

from recsys.redis_state import EVENTS_ADDED, RedisGuard
from serving.state import HistoryStore

_PUSH = """
local function push(key, from, to)
  local i = from
  while i <= to do
    local j = math.min(i + 999, to)
    redis.call('RPUSH', key, unpack(ARGV, i, j))
    i = j + 1
  end
end
local function seed(hist, ver, max_len, first, n)
  redis.call('DEL', hist)
  push(hist, first, first + n - 1)
  redis.call('LTRIM', hist, -max_len, -1)
  redis.call('SET', ver, '0')
end
"""
# KEYS: hist, ver. ARGV: max_len, n_seed (-1: do not seed, answer nil when unseeded), seed items...
_READ = _PUSH + """
local v = redis.call('GET', KEYS[2])
if not v then
  local n = tonumber(ARGV[2])
  if n < 0 then return false end
  seed(KEYS[1], KEYS[2], tonumber(ARGV[1]), 3, n)
  v = '0'
end
return {v, redis.call('LRANGE', KEYS[1], 0, -1)}
"""
# KEYS: seen, stream, hist, ver, the stream's added counter. ARGV: dedup ttl, stream maxlen, max_len, item to append ('' = none),
# n_seed, history ttl in s (0 = none: a known user), seed items..., then the stream entry's field/value pairs.
_INGEST = _PUSH + """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then return {'duplicate', '', ''} end
local n = tonumber(ARGV[5])
local ttl = tonumber(ARGV[6])
local fields = {}
for i = 7 + n, #ARGV do fields[#fields + 1] = ARGV[i] end
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', unpack(fields))
redis.call('INCR', KEYS[5])
local ver = ''
if ARGV[4] ~= '' then
  local max_len = tonumber(ARGV[3])
  if not redis.call('GET', KEYS[4]) then seed(KEYS[3], KEYS[4], max_len, 7, n) end
  redis.call('RPUSH', KEYS[3], ARGV[4])
  redis.call('LTRIM', KEYS[3], -max_len, -1)
  ver = tostring(redis.call('INCR', KEYS[4]))
  if ttl > 0 then
    redis.call('EXPIRE', KEYS[3], ttl)
    redis.call('EXPIRE', KEYS[4], ttl)
  end
end
return {'accepted', id, ver}
"""


@dataclass(frozen=True)
class IngestResult:
    status: str  # "accepted" | "duplicate"
    stream_id: str | None
    history_version: int | None  # None when the event did not touch the history


class OnlineState:
    """Histories, events and cached results of one namespace; one instance per worker."""

    def __init__(
        self, client: redis.Redis, guard: RedisGuard, ns: str, seeds: HistoryStore, *,
        history_max_len: int, stream_maxlen: int, dedup_ttl_s: int, unknown_history_ttl_s: int = 0,
    ):
        self.client, self.guard, self.ns, self.seeds = client, guard, ns, seeds
        self.history_max_len, self.stream_maxlen, self.dedup_ttl_s = history_max_len, stream_maxlen, dedup_ttl_s
        self.unknown_history_ttl_s = unknown_history_ttl_s
        self._read = client.register_script(_READ)
        self._ingest = client.register_script(_INGEST)

    def _seed(self, user_idx: int | None) -> list[int]:
        if user_idx is None:
            return []
        return [int(i) for i in self.seeds.history(user_idx)[-self.history_max_len:]]

    def history(self, user_id: str, user_idx: int | None) -> tuple[np.ndarray, int]:
        """The user's recent items (oldest first) and history version; seeds a known user on first sight.

        An unknown user (``user_idx`` None) without events reads as ``([], 0)`` and leaves no key.
        """
        keys = [f"{self.ns}:hist:{user_id}", f"{self.ns}:hver:{user_id}"]

        def read() -> Any:
            out = self._read(keys=keys, args=[self.history_max_len, -1])
            if out is None and user_idx is not None:  # first sight of a known user: seed from the split
                seed = self._seed(user_idx)
                out = self._read(keys=keys, args=[self.history_max_len, len(seed), *seed])
            return out

        out = self.guard.call(read)
        if out is None:
            return np.zeros(0, dtype=np.int64), 0
        version, items = out
        return np.asarray([int(i) for i in items], dtype=np.int64), int(version)

    def ingest(
        self, event_id: str, user_id: str, user_idx: int | None, item_idx: int | None, fields: dict[str, str],
        *, known: bool = False,
    ) -> IngestResult:
        """Record one event once: stream entry plus, when ``item_idx`` is given, a history append.

        An unknown user's history expires after ``unknown_history_ttl_s``, unless ``known``: a user the
        catalog knows outside the split (``serving.state.CatalogState.outside``) keeps it, as a split user does.
        """
        seed = self._seed(user_idx) if item_idx is not None else []
        keys = [f"{self.ns}:seen:{event_id}", f"{self.ns}:events",
                f"{self.ns}:hist:{user_id}", f"{self.ns}:hver:{user_id}", f"{self.ns}:{EVENTS_ADDED}"]
        pairs = [v for kv in fields.items() for v in kv]
        args = [self.dedup_ttl_s, self.stream_maxlen, self.history_max_len,
                "" if item_idx is None else int(item_idx), len(seed),
                self.unknown_history_ttl_s if user_idx is None and not known else 0, *seed, *pairs]
        status, stream_id, version = self.guard.call(lambda: self._ingest(keys=keys, args=args))
        status = status.decode()
        return IngestResult(
            status=status,
            stream_id=stream_id.decode() or None,
            history_version=int(version) if version else None,
        )

    def log_impressions(self, entries: list[dict[str, str]]) -> None:
        """Append impression entries to the events stream in one round trip (no dedup, no history)."""
        key = f"{self.ns}:events"

        def write() -> None:
            pipe = self.client.pipeline(transaction=False)
            for fields in entries:
                pipe.xadd(key, fields, maxlen=self.stream_maxlen, approximate=True)  # type: ignore[arg-type]
            pipe.incrby(f"{self.ns}:{EVENTS_ADDED}", len(entries))
            pipe.execute()

        self.guard.call(write)

    def cached_result(self, key: str) -> dict[str, Any] | None:
        raw = self.guard.call(lambda: self.client.get(f"{self.ns}:result:{key}"))
        return None if raw is None else json.loads(raw)

    def store_result(self, key: str, answer: dict[str, Any], ttl_s: float) -> None:
        blob = json.dumps(answer, separators=(",", ":"))
        self.guard.call(lambda: self.client.set(f"{self.ns}:result:{key}", blob, px=max(1, int(ttl_s * 1000))))
