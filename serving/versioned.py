"""Versioned rule sets and prompt templates in Redis, with an "active" pointer per kind.

Per kind (``rules``, ``prompts``) under the namespace ``ns``:

- ``{ns}:versions:{kind}``: hash version -> document (canonical JSON of the validated mapping);
- ``{ns}:versions:{kind}:log``: list of versions in the order they were first published;
- ``{ns}:versions:{kind}:created``: hash version -> unix time of first publication;
- ``{ns}:versions:{kind}:active``: the version every worker should serve.

Publishing an existing version with the same document re-activates it (idempotent); with a
different document it is refused (``VersionConflict``): a version names one content, so a
response that reports ``rules: movielens-3`` always means the same rules. Rolling back moves
the active pointer to any published version. Writes are Lua scripts (atomic across workers).

A version is 1..``MAX_VERSION_CHARS`` characters without control characters (``VERSION_PATTERN``);
``publish`` refuses any other (``InvalidVersion``) and ``POST /admin/{kind}/rollback`` accepts
exactly the same, so every published version can be rolled back to.

Deliberately left out: validation of the documents (``serving.hot_reload`` parses them with
the owners' parsers before publishing) and deleting versions (the log is an audit trail).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis

from recsys.documents import check_version
from recsys.redis_state import RedisGuard

KINDS = ("rules", "prompts")

# KEYS: docs, log, created, active. ARGV: version, document, now, only_if_no_active ('1'/'0')
_PUBLISH = """
if ARGV[4] == '1' and redis.call('EXISTS', KEYS[4]) == 1 then return 'kept' end
local have = redis.call('HGET', KEYS[1], ARGV[1])
if have and have ~= ARGV[2] then return 'conflict' end
if not have then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  redis.call('RPUSH', KEYS[2], ARGV[1])
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
end
redis.call('SET', KEYS[4], ARGV[1])
if have then return 'unchanged' end
return 'created'
"""
# KEYS: docs, active. ARGV: version
_ROLLBACK = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('SET', KEYS[2], ARGV[1])
return 1
"""


class VersionConflict(ValueError):
    """A version already exists with a different document."""


class UnknownVersion(KeyError):
    """Rollback to a version that was never published."""


@dataclass(frozen=True)
class VersionInfo:
    version: str
    created_at: float
    active: bool


class VersionStore:
    """Read and write the versions of every kind; calls go through the worker's ``RedisGuard``."""

    def __init__(self, client: redis.Redis, guard: RedisGuard, ns: str):
        self.client, self.guard, self.ns = client, guard, ns
        self._publish = client.register_script(_PUBLISH)
        self._rollback = client.register_script(_ROLLBACK)

    def _keys(self, kind: str) -> tuple[str, str, str, str]:
        if kind not in KINDS:
            raise ValueError(f"unknown versioned kind {kind!r}; known: {list(KINDS)}")
        base = f"{self.ns}:versions:{kind}"
        return base, f"{base}:log", f"{base}:created", f"{base}:active"

    def publish(self, kind: str, version: str, document: str, *, only_if_empty: bool = False) -> str:
        """Store and activate ``version``: "created", "unchanged" or (``only_if_empty``) "kept"."""
        check_version(kind, version)
        args = [version, document, f"{time.time():.3f}", "1" if only_if_empty else "0"]
        out = _text(self.guard.call(lambda: self._publish(keys=list(self._keys(kind)), args=args)))
        if out == "conflict":
            raise VersionConflict(f"{kind} version {version!r} already exists with a different document; "
                                  "bump the version")
        return out

    def rollback(self, kind: str, version: str) -> None:
        docs, _, _, active = self._keys(kind)
        if not self.guard.call(lambda: self._rollback(keys=[docs, active], args=[version])):
            raise UnknownVersion(f"{kind} version {version!r} was never published")

    def active(self, kind: str) -> str | None:
        raw = self.guard.call(lambda: self.client.get(self._keys(kind)[3]))
        return None if raw is None else _text(raw)

    def document(self, kind: str, version: str) -> str | None:
        raw = self.guard.call(lambda: self.client.hget(self._keys(kind)[0], version))
        return None if raw is None else _text(raw)

    def versions(self, kind: str) -> list[VersionInfo]:
        """Every published version, oldest first, with the active one marked."""
        _, log_key, created_key, active_key = self._keys(kind)

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
