"""One worker's link to the online state: Redis client, circuit breaker, stores and watcher.

``OnlineBackend.open`` connects to ``settings.redis_url`` / ``$REDIS_URL``, or starts an
``EmbeddedRedis`` owned by this app when neither is set (a lone app: the CLI demo, tests);
``recsys serve --workers N`` starts one embedded server in the parent instead and passes
its URL, so all workers share one state. Its one Redis client (one connection pool) serves the
online state, the version store and the LLM stage's KV cache tier 2 (``serving.stage_loading``
hands it to the pipeline builder). ``link`` gives a loaded catalog and pipeline what
``serving.service.Recommender.build`` constructs the recommender with: the ``OnlineState`` for
histories/events/cache and the prompt version it reports, after starting a ``VersionWatcher``
that installs the active rules and prompt versions (once at once, so a new worker starts on the
current rules, then every ``versions_poll_s``); a reload links the new pipeline the same way.

The key namespace is ``serving.redis_namespace``, else the artifact directory's name, so
two datasets can share one Redis. ``embedded_redis`` is the one place the embedded server's
options come from (``serving.redis_persist``/``redis_state_dir``: the append-only file under
``<artifacts>/state/redis``; ``redis_maxmemory_mb`` and its eviction policy), for a lone app
and for ``recsys serve``'s parent alike.

The embedded server is supervised (``EmbeddedRedis(supervise=True)``, restarted after a
crash); the backend of the process that runs it (its own, or the one ``recsys serve``
started, found by URL) listens for restarts and then drops idle pooled sockets and closes
its ``RedisGuard``, so answers stop being ``degraded`` as soon as the new server answers.
Workers of ``--workers N`` (other processes) recover on their guard's next retry instead.
``link`` also counts the configured stages that failed to load
(``recsys_stage_load_failures_total``, see ``serving.stage_loading``).

Deliberately left out: the HTTP routes using it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cascade.settings import Settings
from recsys.contract import PromptHolder
from recsys.event_ledger import LEDGER_NAME, LedgerWriter, read_acknowledged
from recsys.pipeline import Pipeline
from recsys.redis_client import RedisGuard, RedisUnavailable, connect
from recsys.redis_server import EmbeddedRedis
from serving.catalog_state import CatalogState
from serving.document_reload import PromptApplier, RulesApplier, VersionWatcher
from serving.metrics import ServingMetrics
from serving.online_state import OnlineState
from serving.stage_loading import degraded_stages
from serving.versioned import VersionStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OnlineLink:
    """What a served recommender is built with (``OnlineBackend.link``): its Redis state, and the
    versions its answers report beside the stages' (the active prompt version, once one is published)."""

    state: OnlineState
    versions: Callable[[], dict[str, str]]


def embedded_redis(settings: Settings, artifact_dir: Path) -> EmbeddedRedis:
    """The supervised embedded Redis for serving ``artifact_dir`` (not started yet)."""
    cfg = settings.serving
    data_dir = None
    if cfg.redis_persist:
        data_dir = cfg.redis_state_dir or Path(artifact_dir).resolve() / "state" / "redis"
    return EmbeddedRedis(supervise=True, data_dir=data_dir, maxmemory_mb=cfg.redis_maxmemory_mb,
                         maxmemory_policy=cfg.redis_maxmemory_policy)


def ledger_path(settings: Settings, artifact_dir: Path) -> Path | None:
    """Where serving keeps its events ledger (``recsys.event_ledger``): beside the Redis data directory
    (``<artifacts>/state/events-ledger.json`` by default); None when it keeps nothing on disk."""
    cfg = settings.serving
    if not cfg.redis_persist:
        return None
    state = Path(cfg.redis_state_dir).resolve().parent if cfg.redis_state_dir else Path(artifact_dir).resolve() / "state"
    return state / LEDGER_NAME


class OnlineBackend:
    def __init__(self, settings: Settings, ns: str, url: str, embedded: EmbeddedRedis | None = None,
                 ledger: Path | None = None):
        cfg = settings.serving
        self.settings, self.ns, self.url, self.embedded, self.ledger = settings, ns, url, embedded, ledger
        self.online: OnlineState | None = None
        self.client = connect(url, cfg.redis_socket_timeout_s)
        self.guard = RedisGuard(cfg.redis_retry_min_s, cfg.redis_retry_max_s)
        self.versions = VersionStore(self.client, self.guard, ns)
        self.watcher: VersionWatcher | None = None
        self.rules: RulesApplier | None = None
        self.prompts: PromptApplier | None = None
        self.supervisor = EmbeddedRedis.supervising(url)  # this process's supervised server, if it is that one
        if self.supervisor is not None:
            self.supervisor.add_restart_listener(self.redis_restarted)

    @classmethod
    def open(cls, settings: Settings, artifact_dir: Path) -> OnlineBackend:
        ns = settings.serving.redis_namespace or Path(artifact_dir).resolve().name
        url = settings.resolve_redis_url()
        embedded = None
        if url is None:
            embedded = embedded_redis(settings, artifact_dir)
            url = embedded.start()
        return cls(settings, ns, url, embedded, ledger_path(settings, artifact_dir))

    def redis_restarted(self) -> None:
        """Supervisor callback: the server is back (from its append-only file), so stop skipping it right away,
        and record the events it came back without.

        Only idle pooled sockets are dropped: one in use may already talk to the new server.
        """
        self.client.connection_pool.disconnect(inuse_connections=False)
        self.guard.reset()
        self._reconcile()

    def _reconcile(self) -> None:
        if self.online is None:
            return
        try:
            lost = self.online.reconcile()
        except RedisUnavailable as exc:
            log.error("could not check the event stream for lost entries: %s", exc)
            return
        if lost:
            log.error("redis holds %d fewer events than this server acknowledged (up to #%d); recorded as lost in "
                      "%s:events:lost", lost, self.online.high_water, self.ns)

    def link(self, catalog: CatalogState, pipeline: Pipeline, explanations: PromptHolder,
             metrics: ServingMetrics) -> OnlineLink:
        """The online state and version provider of a recommender serving ``catalog`` with ``pipeline``
        (``serving.service.Recommender.build``), with the version watcher started on its rules and prompt
        stages and ``explanations`` (the backbone loaded for reasons, if any). Called once at start-up and
        once per reload: the previous pipeline's watcher stops, and the event count carries on from what
        the previous online state acknowledged."""
        cfg = self.settings.serving
        if self.watcher is not None:
            self.watcher.stop()  # the previous pipeline's watcher: the new one gets its own
            self.watcher = None
        for failed in degraded_stages(self.settings, pipeline):
            metrics.stage_load_failures.labels(failed.stage).inc()
        online = OnlineState(
            self.client, self.guard, self.ns, catalog.histories,
            history_max_len=cfg.history_max_len, stream_maxlen=cfg.events_stream_maxlen,
            dedup_ttl_s=cfg.event_dedup_ttl_s, unknown_history_ttl_s=cfg.unknown_history_ttl_s,
            ledger=None if self.ledger is None else LedgerWriter(self.ledger, self.ns),
        )
        if self.online is not None:  # a reload: keep counting from what the previous one acknowledged
            online.raise_floor(self.online.high_water)
        if self.ledger is not None:
            try:
                online.raise_floor(read_acknowledged(self.ledger, self.ns))
            except ValueError as exc:
                log.error("%s; events lost before this start cannot be counted", exc)
        self.online = online
        self._reconcile()
        self.rules, self.prompts = RulesApplier(pipeline), PromptApplier(pipeline, [explanations])
        prompts = self.prompts
        self.watcher = VersionWatcher(self.versions, [self.rules, self.prompts], cfg.versions_poll_s)
        try:
            self.watcher.sync_once()
        except RedisUnavailable as exc:
            log.error("starting without the stored rules/prompt versions: %s", exc)
        self.watcher.start()
        return OnlineLink(online, lambda: {"prompt": prompts.applied} if prompts.applied else {})

    def close(self) -> None:
        if self.supervisor is not None:
            self.supervisor.remove_restart_listener(self.redis_restarted)
        if self.watcher is not None:
            self.watcher.stop()
        if self.online is not None:
            self.online.flush_ledger()
        self.client.close()
        if self.embedded is not None:
            self.embedded.close()
