"""Versioned rule sets and prompt templates in Redis, with an "active" pointer per kind.

Per kind (``rules``, ``prompts``) under the namespace ``ns``:

- ``{ns}:versions:{kind}``: hash version -> document (canonical JSON of the validated mapping);
- ``{ns}:versions:{kind}:log``: list of versions in the order they were first published;
- ``{ns}:versions:{kind}:created``: hash version -> unix time of first publication;
- ``{ns}:versions:{kind}:active``: the version every worker should serve;
- ``{ns}:versions:{kind}:active_seq``: the activation's sequence number (below).

Publishing an existing version with the same document re-activates it (idempotent); with a
different document it is refused (``VersionConflict``): a version names one content, so a
response that reports ``rules: movielens-3`` always means the same rules. Rolling back moves
the active pointer to any published version. Writes are Lua scripts (atomic across workers).

Sequence: every activation (publish, rollback) gets a number larger than any this Redis or the
publishing worker has seen: ``max(stored + 1, floor + 1, Redis clock in microseconds)``. The
clock part keeps it growing across a Redis restart that lost everything, so workers can order
what they serve against what the store says (``serving.document_reload``): a worker never installs a
lower sequence than its own, and re-seeds an emptied store (``seed``) only with the sequence of
what it serves, which never overwrites a higher one.

A publish is applied only if it reaches Redis in time: the script refuses to run after a
deadline (Redis's own clock) that falls before the client gives up waiting, so a publish sent
into a stalled Redis (SIGSTOP, a long fork) and answered with a timeout is not applied later
when the stall ends. ``PublishUnconfirmed`` says how to check in the rare case where Redis
stored it and the answer was lost.

A version is 1..``MAX_VERSION_CHARS`` characters without control characters (``VERSION_PATTERN``);
``publish`` refuses any other (``InvalidVersion``) and ``POST /admin/{kind}/rollback`` accepts
exactly the same, so every published version can be rolled back to.

Deliberately left out: validation of the documents (``serving.document_reload`` parses them with
the owners' parsers before publishing) and deleting versions (the log is an audit trail).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis

from recsys.documents import check_version
from recsys.redis_client import RedisGuard, RedisUnavailable

KINDS = ("rules", "prompts")

# Shared by both scripts: the Redis clock, the deadline check and the next sequence number.
# ARGV[1]: deadline in Redis seconds ('' = none), ARGV[2]: the caller's highest sequence (floor).
_CLOCK = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
if ARGV[1] ~= '' and now > tonumber(ARGV[1]) then return {'late', '0'} end
local cur = tonumber(redis.call('GET', KEYS[5]) or '-1')
if cur < 0 and redis.call('EXISTS', KEYS[4]) == 1 then cur = 0 end  -- stored before sequences: the lowest
local floor = tonumber(ARGV[2])
local function next_seq() return math.max(cur + 1, floor + 1, math.floor(now * 1000000)) end
local function activate(version, seq)
  redis.call('SET', KEYS[4], version)
  redis.call('SET', KEYS[5], string.format('%.0f', seq))
end
"""
# KEYS: docs, log, created, active, active_seq. ARGV: deadline, floor, version, document, mode ('publish'|'seed')
_PUBLISH = _CLOCK + """
if ARGV[5] == 'seed' and redis.call('EXISTS', KEYS[4]) == 1 and cur >= floor then
  return {'kept', string.format('%.0f', cur)}
end
local have = redis.call('HGET', KEYS[1], ARGV[3])
if have and have ~= ARGV[4] then return {'conflict', '0'} end
if not have then
  redis.call('HSET', KEYS[1], ARGV[3], ARGV[4])
  redis.call('RPUSH', KEYS[2], ARGV[3])
  redis.call('HSET', KEYS[3], ARGV[3], string.format('%.3f', now))
end
local seq = floor
if ARGV[5] ~= 'seed' then seq = next_seq() end
activate(ARGV[3], seq)
if have then return {'unchanged', string.format('%.0f', seq)} end
return {'created', string.format('%.0f', seq)}
"""
# KEYS: docs, log, created, active, active_seq. ARGV: deadline, floor, version
_ROLLBACK = _CLOCK + """
if redis.call('HEXISTS', KEYS[1], ARGV[3]) == 0 then return {'unknown', '0'} end
local seq = next_seq()
activate(ARGV[3], seq)
return {'rolled_back', string.format('%.0f', seq)}
"""


class VersionConflict(ValueError):
    """A version already exists with a different document."""


class UnknownVersion(KeyError):
    """Rollback to a version that was never published."""


class PublishUnconfirmed(RedisUnavailable):
    """Redis did not confirm a publish or rollback in time; the message says how to check the outcome."""


@dataclass(frozen=True)
class VersionInfo:
    version: str
    created_at: float
    active: bool


@dataclass(frozen=True)
class Activation:
    """What a publish, rollback or read of the active pointer found: the version and its sequence."""

    version: str
    seq: int
    status: str = "active"  # created | unchanged | kept | rolled_back | active


class VersionStore:
    """Read and write the versions of every kind; calls go through the worker's ``RedisGuard``."""

    def __init__(self, client: redis.Redis, guard: RedisGuard, ns: str, confirm_s: float | None = None):
        """``confirm_s``: how long a write may take to reach Redis before it is refused there (default:
        half the client's socket timeout, so a write the client gave up on is never applied later)."""
        self.client, self.guard, self.ns = client, guard, ns
        if confirm_s is None:
            timeout = client.connection_pool.connection_kwargs.get("socket_timeout")
            confirm_s = None if timeout is None else timeout / 2
        self.confirm_s = confirm_s
        self._publish = client.register_script(_PUBLISH)
        self._rollback = client.register_script(_ROLLBACK)

    def _keys(self, kind: str) -> list[str]:
        if kind not in KINDS:
            raise ValueError(f"unknown versioned kind {kind!r}; known: {list(KINDS)}")
        base = f"{self.ns}:versions:{kind}"
        return [base, f"{base}:log", f"{base}:created", f"{base}:active", f"{base}:active_seq"]

    def _deadline(self) -> str:
        """The latest moment, on Redis's clock, a write sent now may run (one round trip to read it)."""
        if self.confirm_s is None:
            return ""
        sent = time.time()
        secs, micros = self.guard.call(self.client.time)
        offset = secs + micros / 1e6 - (sent + time.time()) / 2
        return f"{time.time() + offset + self.confirm_s:.6f}"

    def _write(self, kind: str, script: Any, args: list[str], what: str) -> tuple[str, int]:
        keys = self._keys(kind)
        full = [self._deadline(), *args]  # a failure here sent nothing: plain RedisUnavailable
        try:
            status, seq = self.guard.call(lambda: script(keys=keys, args=full))
        except RedisUnavailable as exc:
            raise PublishUnconfirmed(
                f"{what}: not confirmed ({exc}). Redis refuses it if it arrives more than {self.confirm_s} s late, "
                f"so after a stall it is not applied; GET /admin/{kind}/versions shows the active version "
                "('active') and what this worker serves ('serving')") from exc
        status = _text(status)
        if status == "late":
            raise PublishUnconfirmed(f"{what}: not applied: it reached Redis more than {self.confirm_s} s late "
                                     "(Redis stalled?); try again")
        return status, int(_text(seq))

    def publish(self, kind: str, version: str, document: str, *, floor: int = -1, seed: bool = False) -> Activation:
        """Store and activate ``version`` with a sequence above ``floor`` (the caller's highest); status
        "created" or "unchanged". ``seed``: activate with exactly ``floor`` unless the active sequence is
        already at least ``floor`` (status "kept"; the active version is left alone)."""
        check_version(kind, version)
        status, seq = self._write(kind, self._publish, [str(floor), version, document, "seed" if seed else "publish"],
                                  f"{kind} version {version!r}")
        if status == "conflict":
            raise VersionConflict(f"{kind} version {version!r} already exists with a different document; "
                                  "bump the version")
        return Activation(version, seq, status)

    def rollback(self, kind: str, version: str, *, floor: int = -1) -> Activation:
        status, seq = self._write(kind, self._rollback, [str(floor), version], f"{kind} rollback to {version!r}")
        if status == "unknown":
            raise UnknownVersion(f"{kind} version {version!r} was never published")
        return Activation(version, seq, status)

    def active_entry(self, kind: str) -> Activation | None:
        """The active version and its sequence (0 when stored without one), or None when none is active."""
        keys = self._keys(kind)
        raw, seq = self.guard.call(lambda: self.client.mget(keys[3], keys[4]))
        return None if raw is None else Activation(_text(raw), 0 if seq is None else int(_text(seq)))

    def active(self, kind: str) -> str | None:
        entry = self.active_entry(kind)
        return None if entry is None else entry.version

    def document(self, kind: str, version: str) -> str | None:
        raw = self.guard.call(lambda: self.client.hget(self._keys(kind)[0], version))
        return None if raw is None else _text(raw)

    def versions(self, kind: str) -> list[VersionInfo]:
        """Every published version, oldest first, with the active one marked."""
        _, log_key, created_key, active_key, _ = self._keys(kind)

        def read() -> list[Any]:
            pipe = self.client.pipeline(transaction=True)
            pipe.lrange(log_key, 0, -1)
            pipe.hgetall(created_key)
            pipe.get(active_key)
            return pipe.execute()

        log, created, active = self.guard.call(read)
        return [VersionInfo(v.decode(), float(created.get(v, b"0")), v == active) for v in log]


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)
