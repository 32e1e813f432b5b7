"""The online event log as a table: read from the Redis stream, export to and load from Parquet.

Serving writes every event to the stream ``{namespace}:events`` (``serving.online``): clicks
and other events through ``POST /v1/events``, impressions from ``POST /v1/recommend`` while an
experiment is active. Each entry is a flat string map (``user_id``, ``item_id``, ``type``,
``ts``, and ``experiment``, ``variant``, ``request_id``, ``rank`` when known). ``read_stream``
pages through it with XRANGE and returns one row per entry with the columns ``COLUMNS``
(missing fields are None; ``ts`` float, ``rank`` nullable int).

Deliberately left out: consumer groups and incremental reads (the analysis reads it all).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from recsys.atomic import atomic_write
from recsys.names import canonical
from recsys.redis_state import EVENTS_ADDED

COLUMNS = ("stream_id", "ts", "type", "user_id", "item_id", "experiment", "variant", "request_id", "rank", "value")
_PAGE = 10_000


def events_frame(entries: Iterable[tuple[str, dict[str, str]]]) -> pd.DataFrame:
    """(stream id, fields) pairs -> the events table, typed."""
    rows = [{"stream_id": sid, **{c: fields.get(c) for c in COLUMNS[1:]}} for sid, fields in entries]
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    df["ts"] = pd.to_numeric(df["ts"], errors="coerce").astype("float64")
    df["rank"] = pd.to_numeric(df["rank"], errors="coerce").astype("Int64")
    df["value"] = pd.to_numeric(df["value"], errors="coerce").astype("float64")
    for c in ("stream_id", "type", "user_id", "item_id", "experiment", "variant", "request_id"):
        df[c] = df[c].astype("object")
    return _one_spelling(df)


def read_stream(client: Any, namespace: str, max_entries: int = 5_000_000) -> pd.DataFrame:
    """Every entry of ``{namespace}:events`` (oldest first, at most ``max_entries``)."""
    key = f"{namespace}:events"
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


def trimmed_warning(client: Any, namespace: str, n_read: int) -> str | None:
    """A warning when ``{namespace}:events`` holds fewer entries than serving ever added to it
    (``recsys.redis_state.EVENTS_ADDED``): ``MAXLEN`` trimmed the oldest, so the analysis covers
    only the later part of the experiment (early users, and the impressions of clicks that remain)."""
    added = client.get(f"{namespace}:{EVENTS_ADDED}")
    if added is None or int(added) <= n_read:
        return None
    return (f"{namespace}:events holds {n_read:,} of the {int(added):,} events serving added: the stream's length cap "
            "(serving.events_stream_maxlen) trimmed the oldest, so this analysis covers only the later part of the "
            "experiment; raise the cap, or export the log (--export) more often")


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
