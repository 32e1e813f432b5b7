"""The online event log as a table: read from the Redis stream, export to and load from Parquet.

Serving writes every event to the stream ``{namespace}:events`` (``serving.online_state``): clicks
and other events through ``POST /v1/events``, impressions from ``POST /v1/recommend`` while an
experiment is active. Each entry is a flat string map (``user_id``, ``item_id``, ``type``,
``ts``, ``seq``, its sequence number, and ``experiment``, ``variant``, ``request_id``, ``rank``
when known). ``read_stream`` pages through it with XRANGE and returns one row per entry with
the columns ``COLUMNS`` (missing fields are None; ``ts`` float, ``rank`` and ``seq`` nullable
ints); ``jobs.ab.integrity`` counts what it lacks. A stream that does not exist
is a ``ValueError`` naming the ``*:events`` streams there are (a wrong namespace read as an
empty log, and the analysis then blamed the events' variants).

Deliberately left out: consumer groups and incremental reads (the analysis reads it all).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from recsys.atomic import atomic_write
from recsys.names import canonical

COLUMNS = ("stream_id", "ts", "type", "user_id", "item_id", "experiment", "variant", "request_id", "rank", "value",
           "seq")
_PAGE = 10_000


def events_frame(entries: Iterable[tuple[str, dict[str, str]]]) -> pd.DataFrame:
    """(stream id, fields) pairs -> the events table, typed."""
    rows = [{"stream_id": sid, **{c: fields.get(c) for c in COLUMNS[1:]}} for sid, fields in entries]
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    df["ts"] = pd.to_numeric(df["ts"], errors="coerce").astype("float64")
    df["rank"] = pd.to_numeric(df["rank"], errors="coerce").astype("Int64")
    df["seq"] = pd.to_numeric(df["seq"], errors="coerce").astype("Int64")
    df["value"] = pd.to_numeric(df["value"], errors="coerce").astype("float64")
    for c in ("stream_id", "type", "user_id", "item_id", "experiment", "variant", "request_id"):
        df[c] = df[c].astype("object")
    return _one_spelling(df)


def read_stream(client: Any, namespace: str, max_entries: int = 5_000_000) -> pd.DataFrame:
    """Every entry of ``{namespace}:events`` (oldest first, at most ``max_entries``); ``ValueError`` when
    there is no such key (``missing_stream_message``)."""
    key = f"{namespace}:events"
    if not client.exists(key):
        raise ValueError(missing_stream_message(client, namespace))
    entries: list[tuple[str, dict[str, str]]] = []
    start = "-"
    while len(entries) < max_entries:
        page = client.xrange(key, min=start, max="+", count=min(_PAGE, max_entries - len(entries)))
        if not page:
            break
        for sid, fields in page:
            entries.append((_text(sid), {_text(k): _text(v) for k, v in fields.items()}))
        start = "(" + entries[-1][0]  # exclusive: continue after the last id read
    return events_frame(entries)


def event_streams(client: Any, limit: int = 20, max_scans: int = 100) -> list[str]:
    """The namespaces of the ``*:events`` streams in ``client`` (sorted, at most ``limit``), from at most
    ``max_scans`` SCAN pages of 1,000 keys: a large Redis is sampled, not walked for ever."""
    found: set[str] = set()
    cursor, scans = 0, 0
    while scans < max_scans and len(found) < limit:
        cursor, keys = client.scan(cursor, match="*:events", count=1_000)
        found.update(_text(k).removesuffix(":events") for k in keys if _text(client.type(k)) == "stream")
        scans += 1
        if cursor == 0:
            break
    return sorted(found)[:limit]


def missing_stream_message(client: Any, namespace: str) -> str:
    """Why ``{namespace}:events`` reads as nothing: it does not exist; the namespaces whose stream does.

    Stream names are written as they are when printable, else quoted (``stream_name``), so the
    message stays one line whatever the namespace holds.

    >>> class Empty:
    ...     def scan(self, cursor, match, count): return 0, []
    >>> missing_stream_message(Empty(), "shop1")
    "shop1:events does not exist: no events under namespace 'shop1', and no *:events stream at all here"
    >>> missing_stream_message(Empty(), "shop1\\nfoo")
    "'shop1\\\\nfoo:events' does not exist: no events under namespace 'shop1\\\\nfoo', and no *:events stream at all here"
    """
    there = event_streams(client)
    missing = f"{stream_name(namespace)} does not exist: no events under namespace {namespace!r}"
    if not there:
        return f"{missing}, and no *:events stream at all here"
    return (f"{missing}; the event streams here are {', '.join(stream_name(n) for n in there)} (serving's namespace "
            "is serving.redis_namespace, by default the name of the artifact directory it was started on)")


def stream_name(namespace: str) -> str:
    """``{namespace}:events`` as written in a message: as is when printable, else quoted by ``repr``.

    >>> stream_name("shop1"), stream_name("a\\tb")
    ('shop1:events', "'a\\\\tb:events'")
    """
    name = f"{namespace}:events"
    return name if name.isprintable() else repr(name)


def export_parquet(events: pd.DataFrame, path: Path) -> Path:
    """Write ``events`` to ``path`` atomically: a failed write leaves no half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, lambda fh: events.to_parquet(fh, index=False))


def load_parquet(path: Path) -> pd.DataFrame:
    """An exported log (or any Parquet with at least ``type``, ``user_id`` and ``variant``)."""
    df = pd.read_parquet(path)
    missing = {"type", "user_id", "variant"} - set(df.columns)
    if missing:
        raise ValueError(f"{path}: events table lacks column(s) {sorted(missing)}")
    for c in COLUMNS:
        if c not in df:
            df[c] = None
    return _one_spelling(df)


def _one_spelling(df: pd.DataFrame) -> pd.DataFrame:
    """User and item ids in NFC (``recsys.names``), as the API now reads them: a log that spans the
    change holds one person's events under two spellings, which would count as two users (and hide
    the arm change their new spelling may have brought from the "more than one arm" warning)."""
    for c in ("user_id", "item_id"):
        df[c] = [canonical(v) if isinstance(v, str) else v for v in df[c]]
    return df


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
