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
  the impressions an active experiment logs (``log_impressions``); every entry carries ``seq``,
  its sequence number;
- ``{ns}:events:added``: the last sequence number given (``INCR`` beside each ``XADD``), so
  `recsys ab analyze` can count the entries trimming dropped (before the first one held);
- ``{ns}:events:lost``: one JSON record per range of sequence numbers this server acknowledged
  and Redis no longer holds (``{"from", "to", "at"}``, see below);
- ``{ns}:seen:{event_id}``: duplicate guard (``SET NX EX event_dedup_ttl_s``);
- ``{ns}:result:{digest}``: cached answers (``SETEX``), see ``serving.policy.result_cache_key``.

Only the stream, its two counters and the rule/prompt versions (``serving.versioned``) live
without a TTL, besides the histories of the users the catalog knows (bounded by the catalog):
the embedded Redis's eviction policy (``volatile-*``) can then only evict what expires.

Lost events: each worker remembers the highest sequence number it acknowledged (its
``high_water``, also kept across restarts in ``serving.event_ledger``'s file) and hands it to
every write as a floor. A Redis that comes back with a lower counter (restarted without its
append-only file, restored from an older one, or reset) has lost the entries in between:
the write records that range in ``{ns}:events:lost`` and moves the counter up to the floor,
all in one script, so numbers are never given twice and `recsys ab analyze` can say how many
events are gone. ``reconcile`` runs the same check without writing an event (at start-up and
after a supervised restart of Redis).

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
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis

from recsys.event_ledger import LedgerWriter
from recsys.redis_client import EVENTS_ADDED, EVENTS_LOST, RedisGuard
from serving.catalog_state import HistoryStore

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
# the next sequence number of the stream, after recording as lost what lies between Redis's counter and the
# caller's floor (the highest number it acknowledged); TIME is fine before writes: effects are replicated
_SEQ = """
local function catch_up(added, lost, floor)
  local cur = tonumber(redis.call('GET', added) or '0')
  if cur >= floor then return 0 end
  local now = redis.call('TIME')
  redis.call('RPUSH', lost, cjson.encode({['from'] = cur + 1, ['to'] = floor, ['at'] = tonumber(now[1])}))
  redis.call('SET', added, floor)
  return floor - cur
end
"""
# KEYS: added, lost. ARGV: floor. Returns how many numbers were recorded as lost.
_RECONCILE = "redis.replicate_commands()\n" + _SEQ + "return catch_up(KEYS[1], KEYS[2], tonumber(ARGV[1]))"
# KEYS: stream, added, lost. ARGV: maxlen, floor, then per entry: its field count n, then n field/value pairs.
_LOG = "redis.replicate_commands()\n" + _SEQ + """
catch_up(KEYS[2], KEYS[3], tonumber(ARGV[2]))
local i, seq = 3, 0
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  seq = redis.call('INCR', KEYS[2])
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 'seq', seq, unpack(ARGV, i + 1, i + 2 * n))
  i = i + 1 + 2 * n
end
return seq
"""
# KEYS: hist, ver. ARGV: max_len, n_seed (-1: do not seed, answer nil when unseeded), seed items...
# The items come back as one space-separated string: the client parses one reply, not one per item.
_READ = _PUSH + """
local v = redis.call('GET', KEYS[2])
if not v then
  local n = tonumber(ARGV[2])
  if n < 0 then return false end
  seed(KEYS[1], KEYS[2], tonumber(ARGV[1]), 3, n)
  v = '0'
end
return {v, table.concat(redis.call('LRANGE', KEYS[1], 0, -1), ' ')}
"""
# KEYS: seen, stream, hist, ver, the stream's added counter, its lost ranges. ARGV: dedup ttl, stream maxlen,
# max_len, item to append ('' = none), n_seed, history ttl in s (0 = none: a known user), floor, seed items...,
# then the stream entry's field/value pairs.
_INGEST = "redis.replicate_commands()\n" + _PUSH + _SEQ + """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then return {'duplicate', '', '', 0} end
local n = tonumber(ARGV[5])
local ttl = tonumber(ARGV[6])
catch_up(KEYS[5], KEYS[6], tonumber(ARGV[7]))
local seq = redis.call('INCR', KEYS[5])
local fields = {'seq', seq}
for i = 8 + n, #ARGV do fields[#fields + 1] = ARGV[i] end
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', unpack(fields))
local ver = ''
if ARGV[4] ~= '' then
  local max_len = tonumber(ARGV[3])
  if not redis.call('GET', KEYS[4]) then seed(KEYS[3], KEYS[4], max_len, 8, n) end
  redis.call('RPUSH', KEYS[3], ARGV[4])
  redis.call('LTRIM', KEYS[3], -max_len, -1)
  ver = tostring(redis.call('INCR', KEYS[4]))
  if ttl > 0 then
    redis.call('EXPIRE', KEYS[3], ttl)
    redis.call('EXPIRE', KEYS[4], ttl)
  end
end
return {'accepted', id, ver, seq}
"""


@dataclass(frozen=True)
class IngestResult:
    status: str  # "accepted" | "duplicate"
    stream_id: str | None
    history_version: int | None  # None when the event did not touch the history
    seq: int | None = None  # the entry's sequence number in the stream (None: duplicate)


class OnlineState:
    """Histories, events and cached results of one namespace; one instance per worker."""

    def __init__(
        self, client: redis.Redis, guard: RedisGuard, ns: str, seeds: HistoryStore, *,
        history_max_len: int, stream_maxlen: int, dedup_ttl_s: int, unknown_history_ttl_s: int = 0,
        ledger: LedgerWriter | None = None,
    ):
        self.client, self.guard, self.ns, self.seeds = client, guard, ns, seeds
        self.history_max_len, self.stream_maxlen, self.dedup_ttl_s = history_max_len, stream_maxlen, dedup_ttl_s
        self.unknown_history_ttl_s = unknown_history_ttl_s
        self._read = client.register_script(_READ)
        self._ingest = client.register_script(_INGEST)
        self._log = client.register_script(_LOG)
        self._reconcile = client.register_script(_RECONCILE)
        self.high_water = 0  # the highest sequence number this worker acknowledged (or read from its ledger)
        self._hw_lock = threading.Lock()
        self.ledger = ledger

    def _acknowledged(self, seq: int) -> None:
        with self._hw_lock:
            self.high_water = max(self.high_water, seq)
        if self.ledger is not None:
            self.ledger.maybe_flush(self.high_water)

    def flush_ledger(self) -> None:
        """Write the high-water mark to the ledger now (shutdown)."""
        if self.ledger is not None:
            self.ledger.flush(self.high_water)

    def raise_floor(self, seq: int) -> None:
        """Also treat ``seq`` as acknowledged (the ledger's number at start-up)."""
        self._acknowledged(seq)

    def _stream_keys(self) -> list[str]:
        return [f"{self.ns}:events", f"{self.ns}:{EVENTS_ADDED}", f"{self.ns}:{EVENTS_LOST}"]

    def reconcile(self) -> int:
        """Record as lost the acknowledged entries Redis no longer holds (a reset, an older file); how many."""
        floor = self.high_water
        return int(self.guard.call(lambda: self._reconcile(keys=self._stream_keys()[1:], args=[floor])))

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
        return np.array(items.split(), dtype=np.int64), int(version)

    def ingest(
        self, event_id: str, user_id: str, user_idx: int | None, item_idx: int | None, fields: dict[str, str],
        *, known: bool = False,
    ) -> IngestResult:
        """Record one event once: stream entry plus, when ``item_idx`` is given, a history append.

        An unknown user's history expires after ``unknown_history_ttl_s``, unless ``known``: a user the
        catalog knows outside the split (``serving.catalog_state.CatalogState.outside``) keeps it, as a split user does.
        """
        seed = self._seed(user_idx) if item_idx is not None else []
        stream, added, lost = self._stream_keys()
        keys = [f"{self.ns}:seen:{event_id}", stream, f"{self.ns}:hist:{user_id}", f"{self.ns}:hver:{user_id}",
                added, lost]
        pairs = [v for kv in fields.items() if kv[0] != "seq" for v in kv]
        args = [self.dedup_ttl_s, self.stream_maxlen, self.history_max_len,
                "" if item_idx is None else int(item_idx), len(seed),
                self.unknown_history_ttl_s if user_idx is None and not known else 0, self.high_water, *seed, *pairs]
        status, stream_id, version, seq = self.guard.call(lambda: self._ingest(keys=keys, args=args))
        if seq:
            self._acknowledged(int(seq))
        return IngestResult(
            status=status.decode(),
            stream_id=stream_id.decode() or None,
            history_version=int(version) if version else None,
            seq=int(seq) or None,
        )

    def log_impressions(self, entries: list[dict[str, str]]) -> None:
        """Append impression entries to the events stream in one round trip (no dedup, no history)."""
        if not entries:
            return
        args: list[Any] = [self.stream_maxlen, self.high_water]
        for fields in entries:
            pairs = [v for kv in fields.items() if kv[0] != "seq" for v in kv]
            args += [len(pairs) // 2, *pairs]
        last = self.guard.call(lambda: self._log(keys=self._stream_keys(), args=args))
        self._acknowledged(int(last))

    def cached_result(self, key: str) -> dict[str, Any] | None:
        raw = self.guard.call(lambda: self.client.get(f"{self.ns}:result:{key}"))
        return None if raw is None else json.loads(raw)

    def store_result(self, key: str, answer: dict[str, Any], ttl_s: float) -> None:
        blob = json.dumps(answer, separators=(",", ":"))
        self.guard.call(lambda: self.client.set(f"{self.ns}:result:{key}", blob, px=max(1, int(ttl_s * 1000))))
