"""Prometheus metrics of the service: per-stage latency, answer paths, cache, fallbacks, errors.

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

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)

from recsys.contract import StageTrace

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST


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

    def observe_answer(self, path: str, seconds: float, traces: list[StageTrace]) -> None:
        self.requests.labels(path).inc()
        self.request_seconds.labels(path).observe(seconds)
        for t in traces:
            if t.status == "ok":
                self.stage_seconds.labels(t.name).observe(t.ms / 1000)
            elif t.status == "fallback":
                self.fallbacks.labels(t.name).inc()

    def render(self) -> bytes:
        """The exposition text: every worker's values in multi-process mode, else this app's."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)
