"""The Health page's numbers, computed from the app's own Prometheus exposition (``/metrics``).

``parse_exposition`` reads the text ``ServingMetrics.render`` serves (every worker's values in
multi-process mode) into a ``Snapshot``; ``summarize(now, base)`` turns the difference of two
snapshots into request and per-stage latency percentiles, the result-cache hit rate, fallbacks
per stage, errors and Redis trouble over that window. ``MetricsWindow`` keeps the snapshots a
worker took when the Health page asked, so "the last five minutes" is the difference between
now and the newest snapshot at least five minutes old; with none that old the window starts at
the process start (the counters' zero) and says so.

Percentiles come from histogram buckets as Prometheus' ``histogram_quantile`` computes them:
linear interpolation inside the bucket holding the rank, the highest finite bound when the
rank falls in ``+Inf``. With the service's buckets (1 ms, 2.5 ms, 5 ms, ...) a p99 is
therefore a bucket-resolution estimate, not an exact order statistic.

Deliberately left out: anything HTTP (``serving.console.api``) and storing history beyond one
baseline per window.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# sample name -> frozenset of (label, value) pairs -> value
Snapshot = dict[str, dict[frozenset[tuple[str, str]], float]]
QUANTILES = {"p50": 0.5, "p95": 0.95, "p99": 0.99}


def parse_exposition(text: str) -> Snapshot:
    """Every sample of the exposition, keyed by sample name then label set (``_created`` left out)."""
    out: Snapshot = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            out.setdefault(sample.name, {})[frozenset(sample.labels.items())] = float(sample.value)
    return out


def difference(now: Snapshot, base: Snapshot | None) -> Snapshot:
    """``now - base`` sample by sample; ``now`` itself when ``base`` is None or a counter went back
    (a worker restarted: its cumulative values began again at zero)."""
    if not base:
        return now
    out: Snapshot = {}
    for name, series in now.items():
        before = base.get(name, {})
        out[name] = {labels: value - before.get(labels, 0.0) for labels, value in series.items()}
        if any(v < 0 for v in out[name].values()):
            return now
    return out


def _by_label(snap: Snapshot, name: str, label: str) -> dict[str, float]:
    """``{label value: sample value}`` of sample ``name``, summed over any other labels."""
    out: dict[str, float] = {}
    for labels, value in snap.get(name, {}).items():
        key = dict(labels).get(label, "")
        out[key] = out.get(key, 0.0) + value
    return out


def buckets_by_label(snap: Snapshot, family: str, label: str) -> dict[str, list[tuple[float, float]]]:
    """``{label value: [(upper bound, cumulative count), ...]}`` of histogram ``family``, bounds ascending."""
    grouped: dict[str, dict[float, float]] = {}
    for labels, value in snap.get(f"{family}_bucket", {}).items():
        d = dict(labels)
        bound = float(d["le"])
        series = grouped.setdefault(d.get(label, ""), {})
        series[bound] = series.get(bound, 0.0) + value
    return {key: sorted(series.items()) for key, series in grouped.items()}


def merge_buckets(series: Iterable[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """One histogram from several with the same bounds (e.g. every answer path's)."""
    total: dict[float, float] = {}
    for buckets in series:
        for bound, count in buckets:
            total[bound] = total.get(bound, 0.0) + count
    return sorted(total.items())


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The ``q`` quantile of cumulative ``buckets`` (ascending bounds, the last ``+Inf``); None if empty.

    >>> histogram_quantile(0.5, [(0.001, 0.0), (0.0025, 4.0), (math.inf, 4.0)])  # rank 2 of 4 in (1 ms, 2.5 ms]
    0.00175
    """
    if not 0 <= q <= 1:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank and count > below:
            if math.isinf(bound):  # beyond the largest finite bucket: its bound is all we know
                return lower
            return round(lower + (bound - lower) * (rank - below) / (count - below), 9)
        lower, below = bound, count
    return lower


def _percentiles_ms(buckets: list[tuple[float, float]]) -> dict[str, float | None]:
    out: dict[str, float | None] = {"count": buckets[-1][1] if buckets else 0.0}
    for name, q in QUANTILES.items():
        value = histogram_quantile(q, buckets)
        out[name] = None if value is None else round(value * 1000, 3)
    return out


def _counter(snap: Snapshot, name: str, label: str) -> dict[str, float]:
    return {k: v for k, v in _by_label(snap, f"{name}_total", label).items() if v > 0}


def summarize(now: Snapshot, base: Snapshot | None = None) -> dict[str, Any]:
    """The Health page's metrics over the window ``base`` .. ``now`` (``base`` None: since start)."""
    snap = difference(now, base)
    paths = buckets_by_label(snap, "recsys_request_seconds", "path")
    stages = buckets_by_label(snap, "recsys_stage_seconds", "stage")
    cache = _by_label(snap, "recsys_result_cache_total", "outcome")
    hits, misses = cache.get("hit", 0.0), cache.get("miss", 0.0)
    fallbacks = _counter(snap, "recsys_stage_fallbacks", "stage")
    return {
        "requests": {"latency_ms": _percentiles_ms(merge_buckets(paths.values())),
                     "by_path": {path: _percentiles_ms(b) for path, b in sorted(paths.items())}},
        "stages": {stage: _percentiles_ms(b) for stage, b in stages.items()},
        "cache": {"hits": hits, "misses": misses,
                  "hit_rate": round(hits / (hits + misses), 4) if hits + misses else None},
        "fallbacks": fallbacks, "fallbacks_total": sum(fallbacks.values()),
        "routes": _counter(snap, "recsys_route", "reason"),
        "errors": _counter(snap, "recsys_errors", "kind"),
        "degraded_requests": sum(_by_label(snap, "recsys_degraded_requests_total", "").values()),
        "redis_errors": sum(_by_label(snap, "recsys_redis_errors_total", "").values()),
    }


class MetricsWindow:
    """Snapshots one worker took on request, to report "the last ``window_s`` seconds".

    Keeps only what a later call can use as its baseline: every snapshot younger than the
    window and the newest one older than it.
    """

    def __init__(self, window_s: float = 300.0):
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self._snaps: deque[tuple[float, Snapshot]] = deque()
        self._lock = threading.Lock()

    def observe(self, snap: Snapshot, at: float | None = None) -> tuple[float | None, Snapshot | None]:
        """Record ``snap`` taken at ``at`` (monotonic s); return the baseline ``(time, snapshot)``
        at least ``window_s`` older, or ``(None, None)`` when there is none yet."""
        at = time.monotonic() if at is None else at
        with self._lock:
            while len(self._snaps) > 1 and at - self._snaps[1][0] >= self.window_s:
                self._snaps.popleft()
            base = self._snaps[0] if self._snaps and at - self._snaps[0][0] >= self.window_s else None
            self._snaps.append((at, snap))
        return (base[0], base[1]) if base else (None, None)


def window_summary(window: MetricsWindow, text: str, at: float | None = None) -> dict[str, Any]:
    """``summarize`` over ``window``, with a ``window`` entry saying what the numbers cover."""
    at = time.monotonic() if at is None else at
    now = parse_exposition(text)
    base_t, base = window.observe(now, at)
    out = summarize(now, base)
    out["window"] = ({"since_start": True, "seconds": None} if base_t is None
                     else {"since_start": False, "seconds": round(at - base_t, 1)})
    return out

