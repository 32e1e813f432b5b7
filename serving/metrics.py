"""Prometheus metrics of the service: per-stage latency, answer paths, caches, fallbacks, errors.

The LLM's block prefix cache (``llm_rerank.kvcache``) counts in plain Python, per process
(``PROCESS_COUNTS``); ``ServingMetrics`` copies what was added since its last look into the
``recsys_llm_prefix_cache_*`` counters after every answer and before every scrape: lookups by
outcome (``full``: the whole prompt prefix was cached, ``partial``, ``miss``), blocks by the
tier that served them (``tier1_hit``, ``tier2_hit``, ``miss``), blocks stored, tier-2 bytes,
evictions per tier and tier-2 errors. ``llm_cache_counts`` reads them back from the
exposition text (``recsys demo`` and ``recsys bench serve`` diff two scrapes).

One ``ServingMetrics`` per app, on its own ``CollectorRegistry`` (tests build many apps in
one process). Several workers: when ``PROMETHEUS_MULTIPROC_DIR`` is set (``serving.run``
sets it for ``--workers > 1``), prometheus_client writes every value to per-process files
in that directory and ``render`` aggregates all workers with a ``MultiProcessCollector``, so
whichever worker answers ``/metrics`` reports the whole server. Gauges are left out on
purpose (their multi-process semantics are per-pid); Redis health is a counter of
degraded requests plus ``redis_errors_total``.

Deliberately left out: pushing metrics anywhere (Prometheus scrapes ``/metrics``).
"""

from __future__ import annotations

import os
import threading

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.parser import text_string_to_metric_families

from llm_rerank.kvcache import LOOKUP_OUTCOMES, PROCESS_COUNTS
from recsys.contract import StageTrace

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST
# (metric, label name, label value) of each llm_rerank.kvcache counter; the metric name gets "_total"
_PREFIX_CACHE_SERIES = {
    **{f"lookups_{o}": ("recsys_llm_prefix_cache_lookups", "outcome", o) for o in LOOKUP_OUTCOMES},
    "tier1_hits": ("recsys_llm_prefix_cache_blocks", "result", "tier1_hit"),
    "tier2_hits": ("recsys_llm_prefix_cache_blocks", "result", "tier2_hit"),
    "misses": ("recsys_llm_prefix_cache_blocks", "result", "miss"),
    "stored": ("recsys_llm_prefix_cache_stored_blocks", "", ""),
    "tier2_bytes_read": ("recsys_llm_prefix_cache_tier2_bytes", "direction", "read"),
    "tier2_bytes_written": ("recsys_llm_prefix_cache_tier2_bytes", "direction", "written"),
    "tier1_evictions": ("recsys_llm_prefix_cache_evictions", "tier", "1"),
    "tier2_evictions": ("recsys_llm_prefix_cache_evictions", "tier", "2"),
    "tier2_errors": ("recsys_llm_prefix_cache_tier2_errors", "", ""),
}
_PREFIX_CACHE_HELP = {
    "recsys_llm_prefix_cache_lookups": "LLM prefix-cache lookups by outcome: full (whole prefix cached), partial, miss.",
    "recsys_llm_prefix_cache_blocks": "LLM prefix-cache blocks looked up, by the tier that had them (or miss).",
    "recsys_llm_prefix_cache_stored_blocks": "LLM prefix-cache blocks computed and stored.",
    "recsys_llm_prefix_cache_tier2_bytes": "Bytes of KV blocks read from / written to tier 2 (Redis).",
    "recsys_llm_prefix_cache_evictions": "LLM prefix-cache blocks evicted, per tier.",
    "recsys_llm_prefix_cache_tier2_errors": "Tier-2 (Redis) calls that failed and were answered as misses.",
}


class ServingMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.request_seconds = Histogram(
            "recsys_request_seconds", "Recommendation latency in the server, by answer path.", ["path"],
            buckets=_LATENCY_BUCKETS, registry=r)
        self.stage_seconds = Histogram(
            "recsys_stage_seconds", "Latency of each pipeline stage that ran.", ["stage"],
            buckets=_LATENCY_BUCKETS, registry=r)
        self.requests = Counter("recsys_requests", "Recommendations by answer path.", ["path"], registry=r)
        self.routes = Counter("recsys_route", "Traffic policy decisions, by reason.", ["reason"], registry=r)
        self.cache = Counter("recsys_result_cache", "Result cache lookups by outcome.", ["outcome"], registry=r)
        self.fallbacks = Counter("recsys_stage_fallbacks", "Stage fallbacks (error, budget, deadline).", ["stage"],
                                 registry=r)
        self.errors = Counter("recsys_errors", "Requests answered with an error status, by kind.", ["kind"],
                              registry=r)
        self.degraded = Counter("recsys_degraded_requests", "Requests served without Redis (split histories).",
                                registry=r)
        self.redis_errors = Counter("recsys_redis_errors", "Redis calls that failed or were skipped in backoff.",
                                    registry=r)
        self.events = Counter("recsys_events", "Events received, by type and outcome.", ["type", "status"],
                              registry=r)
        self.reloads = Counter("recsys_version_changes", "Rules/prompt versions installed by admin calls.", ["kind"],
                               registry=r)
        self.stage_load_failures = Counter(
            "recsys_stage_load_failures", "Configured, enabled stages that failed to load; served without them.",
            ["stage"], registry=r)
        self._prefix_cache: dict[str, Counter] = {}
        for name, help_text in _PREFIX_CACHE_HELP.items():
            labels = sorted({lab for m, lab, _ in _PREFIX_CACHE_SERIES.values() if m == name and lab})
            self._prefix_cache[name] = Counter(name, help_text, labels, registry=r)
        self._prefix_seen = PROCESS_COUNTS.snapshot()  # this app counts from its creation on
        self._prefix_lock = threading.Lock()

    def sync_prefix_cache(self) -> None:
        """Add what the process's LLM prefix caches counted since the last call to the counters."""
        with self._prefix_lock:
            now = PROCESS_COUNTS.snapshot()
            for key, (name, label, value) in _PREFIX_CACHE_SERIES.items():
                delta = now[key] - self._prefix_seen[key]
                if delta > 0:
                    counter = self._prefix_cache[name]
                    (counter.labels(value) if label else counter).inc(delta)
            self._prefix_seen = now

    def observe_answer(self, path: str, seconds: float, traces: list[StageTrace]) -> None:
        self.requests.labels(path).inc()
        self.request_seconds.labels(path).observe(seconds)
        for t in traces:
            if t.status == "ok":
                self.stage_seconds.labels(t.name).observe(t.ms / 1000)
            elif t.status == "fallback":
                self.fallbacks.labels(t.name).inc()
        self.sync_prefix_cache()

    def render(self) -> bytes:
        """The exposition text: every worker's values in multi-process mode, else this app's."""
        self.sync_prefix_cache()
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)


def llm_cache_counts(exposition: str) -> dict[str, float]:
    """The ``recsys_llm_prefix_cache_*`` counters of a ``/metrics`` text, keyed like
    ``llm_rerank.kvcache.PROCESS_COUNTS`` (absent series read 0).

    >>> llm_cache_counts('recsys_llm_prefix_cache_blocks_total{result="tier1_hit"} 26.0')["tier1_hits"]
    26.0
    """
    by_series = {(name + "_total", label, value): key for key, (name, label, value) in _PREFIX_CACHE_SERIES.items()}
    out = dict.fromkeys(_PREFIX_CACHE_SERIES, 0.0)
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            label, value = next(iter(sample.labels.items()), ("", ""))
            key = by_series.get((sample.name, label, value))
            if key is not None:
                out[key] += sample.value
    out["lookups"] = sum(out[f"lookups_{o}"] for o in LOOKUP_OUTCOMES)
    out["blocks_requested"] = out["tier1_hits"] + out["tier2_hits"] + out["misses"]
    return out
