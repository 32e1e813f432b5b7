"""Is the event log whole? Counts of the events serving accepted that the stream no longer holds.

Serving numbers every stream entry (``seq``, 1, 2, ...; ``serving.online_state``) and keeps, in
Redis, the last number given (``{ns}:events:added``) and the ranges it acknowledged that a
restarted or reset Redis came back without (``{ns}:events:lost``), and, outside Redis, the
highest number it acknowledged (``recsys.event_ledger``). From those and the entries read,
``stream_integrity`` counts what is missing and why:

- ``trimmed``: numbers before the first entry held, which the stream's length cap
  (``serving.events_stream_maxlen``) dropped;
- ``lost``: the recorded ranges (Redis lost them: restarted without its append-only file,
  restored from an older one, reset);
- ``not_in_redis``: numbers the ledger says serving acknowledged above Redis's counter, when
  no server has run on this Redis since it lost them (so nothing recorded the range yet);
- ``unexplained``: other holes in the numbering (entries deleted by hand).

``integrity_warning`` turns the counts into the one warning `recsys ab analyze` prints.
Entries written before the numbering (no ``seq``) are counted as held; for a stream of such
entries only, the counter is compared with the length, as before.

Deliberately left out: repairing anything (the lost events are gone; the report says so).
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from jobs.ab.events import stream_name
from recsys.redis_client import EVENTS_ADDED, EVENTS_LOST


def _overlap(ranges: list[dict[str, int]], lo: int, hi: int) -> int:
    """How many numbers of ``[lo, hi]`` the (disjoint) ranges cover."""
    return sum(max(0, min(hi, r["to"]) - max(lo, r["from"]) + 1) for r in ranges)


def lost_ranges(client: Any, namespace: str) -> list[dict[str, int]]:
    """The recorded lost ranges of ``namespace`` (``{"from", "to", "at"}``), oldest first."""
    out = []
    for raw in client.lrange(f"{namespace}:{EVENTS_LOST}", 0, -1):
        try:
            rec = json.loads(raw)
            out.append({"from": int(rec["from"]), "to": int(rec["to"]), "at": int(rec.get("at", 0))})
        except (ValueError, KeyError, TypeError):
            continue  # not written by serving: ignored rather than trusted
    return out


def stream_integrity(client: Any, namespace: str, events: pd.DataFrame,
                     acknowledged: int | None = None) -> dict[str, Any]:
    """The counts above for the ``events`` read from ``namespace`` (``acknowledged``: the ledger's number)."""
    added = int(client.get(f"{namespace}:{EVENTS_ADDED}") or 0)
    ranges = lost_ranges(client, namespace)
    seqs = pd.to_numeric(events["seq"], errors="coerce").dropna().astype("int64") if "seq" in events else pd.Series(dtype="int64")
    held, numbered = len(events), len(seqs)
    lost = sum(r["to"] - r["from"] + 1 for r in ranges)
    if numbered:
        first, last = int(seqs.min()), int(seqs.max())
        before = first - 1 - _overlap(ranges, 1, first - 1)  # numbers before the first held, not recorded lost
        trimmed = max(0, before - (held - numbered))  # entries from before the numbering fill the oldest numbers
        top = max(added, last)
        unexplained = max(0, (top - first + 1) - _overlap(ranges, first, top) - seqs.nunique())
    else:
        trimmed, unexplained, top = max(0, added - held - lost), 0, added  # no numbers: the count alone
    not_in_redis = max(0, (acknowledged or 0) - top)
    accepted = top + not_in_redis
    return {"accepted": accepted, "held": held, "missing": trimmed + lost + unexplained + not_in_redis,
            "trimmed": trimmed, "lost": lost, "lost_ranges": ranges, "not_in_redis": not_in_redis,
            "unexplained": unexplained, "ledger": acknowledged}


def integrity_warning(namespace: str, counts: dict[str, Any], *, analysis: bool = True) -> str | None:
    """One line saying how many accepted events the analysis lacks and why; None when none is missing.

    ``analysis`` False: the line without the closing sentence about what the analysis covers.
    """
    if not counts["missing"]:
        return None
    why = []
    if counts["lost"]:
        spans = ", ".join(f"#{r['from']}-#{r['to']}" for r in counts["lost_ranges"][:5])
        why.append(f"{counts['lost']:,} lost when Redis came back without them ({spans}; restarted without its "
                   "append-only file, restored from an older one, or reset)")
    if counts["not_in_redis"]:
        why.append(f"{counts['not_in_redis']:,} acknowledged by serving (its ledger reaches #{counts['ledger']:,}) "
                   "above what this Redis ever recorded: it was reset or restored from an older file")
    if counts["trimmed"]:
        why.append(f"{counts['trimmed']:,} trimmed, the oldest, by the stream's length cap "
                   "(serving.events_stream_maxlen; raise it, or export the log with --export more often)")
    if counts["unexplained"]:
        why.append(f"{counts['unexplained']:,} missing from the numbering without a record (deleted by hand?)")
    line = (f"{stream_name(namespace)} holds {counts['held']:,} of the {counts['accepted']:,} events serving "
            f"accepted; {counts['missing']:,} are missing: {'; '.join(why)}")
    return line + ". This analysis covers only the events held" if analysis else line
