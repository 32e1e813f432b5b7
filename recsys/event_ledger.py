"""The events ledger: the highest event sequence number serving acknowledged, kept outside Redis.

Every entry of the event stream carries a sequence number (``serving.online_state``). Redis keeps
the stream and its counter together, so a Redis that comes back empty, or from an older
append-only file, holds a consistent but shorter stream: nothing inside it tells what is
missing. Serving therefore also writes, at most once a second and at shutdown, the highest
number it acknowledged to a client into a small JSON file beside the Redis state
(``<artifacts>/state/events-ledger.json``), one entry per key namespace:

    {"namespaces": {"ml-100k": {"acknowledged": 1600, "updated": 1765000000.0}}}

At start-up a worker takes the ledger's number as its floor, so the first write (or
``OnlineState.reconcile``) records the gap in Redis; `recsys ab analyze --ledger FILE` reads
it too and warns when Redis's counter is behind it. Several worker processes share one file:
each update is a read, a ``max`` and an atomic replace under an exclusive ``flock``, so a
number never goes down. The file is fsynced: after a machine crash it lags by at most the
last second, like the append-only file itself.

Deliberately left out: the events themselves (they live in Redis only).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import IO

from recsys.atomic import atomic_write

log = logging.getLogger(__name__)
LEDGER_NAME = "events-ledger.json"
FLUSH_EVERY_S = 1.0


def read_acknowledged(path: Path, namespace: str) -> int:
    """The ledger's number for ``namespace`` (0 when the file or the entry is absent).

    ``ValueError`` naming the file when it is not a ledger (not JSON, or numbers that are not).
    """
    path = Path(path)
    if not path.exists():
        return 0
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        entry = data.get("namespaces", {}).get(namespace, {})
        return int(entry.get("acknowledged", 0))
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not an events ledger ({type(exc).__name__}: {exc})") from None


def advance(path: Path, namespace: str, acknowledged: int) -> int:
    """Raise the ledger's number for ``namespace`` to ``acknowledged`` (never lower it); the stored number."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        except (json.JSONDecodeError, UnicodeDecodeError):
            log.error("%s is not an events ledger; starting it again", path)
            data = {}
        spaces = data.setdefault("namespaces", {})
        stored = int(spaces.get(namespace, {}).get("acknowledged", 0))
        if acknowledged <= stored:
            return stored
        spaces[namespace] = {"acknowledged": acknowledged, "updated": round(time.time(), 3)}
        blob = json.dumps(data, indent=1, sort_keys=True).encode()

        def write(fh: IO[bytes]) -> None:
            fh.write(blob)
            fh.flush()
            os.fsync(fh.fileno())

        atomic_write(path, write)
        return acknowledged


class LedgerWriter:
    """Writes one worker's high-water mark to the ledger, at most every ``FLUSH_EVERY_S`` seconds.

    ``maybe_flush`` is called on request threads after each acknowledged write: it returns at
    once unless a second has passed, and only one thread writes at a time. ``flush`` writes now
    (shutdown). A failed write is logged, never raised: events are still in Redis.
    """

    def __init__(self, path: Path, namespace: str, every_s: float = FLUSH_EVERY_S):
        self.path, self.namespace, self.every_s = Path(path), namespace, every_s
        self._written = 0
        self._last = 0.0
        self._lock = threading.Lock()

    def maybe_flush(self, high_water: int) -> None:
        if high_water <= self._written or time.monotonic() - self._last < self.every_s:
            return
        if self._lock.acquire(blocking=False):
            try:
                self._write(high_water)
            finally:
                self._lock.release()

    def flush(self, high_water: int) -> None:
        with self._lock:
            if high_water > self._written:
                self._write(high_water)

    def _write(self, high_water: int) -> None:
        self._last = time.monotonic()
        try:
            self._written = advance(self.path, self.namespace, high_water)
        except OSError as exc:
            log.error("cannot update the events ledger %s: %s", self.path, exc)
