"""One worker's link to the online state: Redis client, circuit breaker, stores and watcher.

``OnlineBackend.open`` connects to ``settings.redis_url`` / ``$REDIS_URL``, or starts an
``EmbeddedRedis`` owned by this app when neither is set (a lone app: the CLI demo, tests);
``recsys serve --workers N`` starts one embedded server in the parent instead and passes
its URL, so all workers share one state. ``attach`` wires a loaded ``Recommender`` to it (``replace`` re-wires a reloaded one):
the ``OnlineState`` for histories/events/cache and a ``VersionWatcher`` that installs the
active rules and prompt versions (once at once, so a new worker starts on the current
rules, then every ``versions_poll_s``).

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
``attach`` also counts the configured stages that failed to load
(``recsys_stage_load_failures_total``, see ``serving.stage_loading``).

Deliberately left out: the HTTP routes using it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from cascade.settings import Settings
from recsys.event_ledger import LEDGER_NAME, LedgerWriter, read_acknowledged
from recsys.redis_state import EmbeddedRedis, RedisGuard, RedisUnavailable, connect
from serving.hot_reload import PromptApplier, RulesApplier, VersionWatcher
from serving.online import OnlineState
from serving.service import Recommender
from serving.stage_loading import degraded_stages
from serving.versioned import VersionStore

log = logging.getLogger(__name__)


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

    def attach(self, recommender: Recommender) -> None:
        """Give ``recommender`` its online state and start watching versions (call once)."""
        cfg = self.settings.serving
        for failed in degraded_stages(self.settings, recommender.pipeline):
            recommender.metrics.stage_load_failures.labels(failed.stage).inc()
        online = OnlineState(
            self.client, self.guard, self.ns, recommender.catalog.histories,
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
        recommender.online = self.online = online
        self._reconcile()
        self.rules, self.prompts = RulesApplier(recommender.pipeline), PromptApplier(recommender.pipeline)
        self.prompts.stages.append(recommender.explanations)  # the backbone loaded for reasons, if any
        prompts = self.prompts
        recommender.extra_versions = lambda: {"prompt": prompts.applied} if prompts.applied else {}
        self.watcher = VersionWatcher(self.versions, [self.rules, self.prompts], cfg.versions_poll_s)
        try:
            self.watcher.sync_once()
        except RedisUnavailable as exc:
            log.error("starting without the stored rules/prompt versions: %s", exc)
        self.watcher.start()

    def replace(self, recommender: Recommender) -> None:
        """``attach`` a reloaded ``recommender`` in place of the current one (``serving.reload``)."""
        if self.watcher is not None:
            self.watcher.stop()  # the old pipeline's watcher: the new one gets its own
            self.watcher = None
        self.attach(recommender)

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
