"""Process entry points: ``serve`` (uvicorn) and ``recommend_once`` (one in-process answer).

With ``workers > 1`` uvicorn needs an import string, not an app object: ``serve`` then
passes the settings (as JSON) and the artifact directory to the worker processes through
environment variables, and each worker builds its app with ``app_from_env``. The variable
names avoid the ``RECSYS_`` prefix on purpose: ``Settings`` reads every ``RECSYS_*``
variable as a configuration key and refuses unknown ones (``cascade.settings``).

Shared state across workers: ``serve`` resolves Redis before forking. Without
``settings.redis_url`` / ``$REDIS_URL`` (``Settings.resolve_redis_url``) it starts ONE embedded
Redis in the parent (supervised: restarted if it dies, see ``recsys.redis_server``) and puts its
URL into the settings every worker receives; with ``workers > 1`` it also points
``PROMETHEUS_MULTIPROC_DIR`` at a fresh directory so ``/metrics`` aggregates all workers.
Logs are JSON lines (``serving.logs``) in every process.

Signals: SIGINT, SIGTERM and SIGHUP (``STOP_SIGNALS``) each stop the server cleanly, with one worker
(``DrainingServer``) or several (``StoppingSupervisor``, whose workers leave SIGHUP and SIGINT to it): requests
in flight are answered, the workers' lifespans close their Redis links, the embedded Redis is stopped,
and the process exits with ``128 + signum`` (130, 143, 129), as ``docs/operations.md`` documents.

The client address is the connection's peer: uvicorn's ``X-Forwarded-For`` handling is off
(``proxy_headers=False``; uvicorn trusts the header from loopback by default, so any local
client could name itself anew per request and slip the events rate limit). Behind a gateway,
``serving.rate_limit_client_header`` names the header the gateway writes.

Deliberately left out: the command-line interface itself (``cli``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI
from pydantic import ValidationError
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess

from cascade.registry import build_stage
from cascade.settings import Settings
from recsys.child_guard import die_with_parent
from recsys.config import POLICY_KINDS
from serving.app import create_app
from serving.logs import log_config
from serving.online_backend import embedded_redis
from serving.schemas import RecommendRequest, within_limits
from serving.service import Recommender

ENV_ARTIFACT_DIR = "SERVING_ARTIFACT_DIR"  # required by app_from_env
ENV_SETTINGS_JSON = "SERVING_SETTINGS_JSON"  # the full settings, as serve() resolved them
ENV_CONFIG_PATH = "SERVING_CONFIG"  # or a pipeline YAML (env RECSYS_* still applies on top)
APP_FACTORY = "serving.run:app_from_env"
ENV_SUPERVISOR_PID = "SERVING_SUPERVISOR_PID"  # a worker whose parent is this pid leaves SIGHUP/SIGINT to it
# a clean stop on each: drain in-flight requests, stop the embedded Redis, exit 128 + signum (docs/operations.md)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def settings_from_env(environ: dict[str, str] | None = None) -> Settings:
    """Settings for a worker: ``SERVING_SETTINGS_JSON``, else ``SERVING_CONFIG``, else the default YAML."""
    env = os.environ if environ is None else environ
    if env.get(ENV_SETTINGS_JSON):
        return Settings.build(json.loads(env[ENV_SETTINGS_JSON]), source=f"${ENV_SETTINGS_JSON}")
    return Settings.from_yaml(env.get(ENV_CONFIG_PATH) or None)


def app_from_env() -> FastAPI:
    """uvicorn factory (``--factory serving.run:app_from_env``) for worker processes."""
    artifact_dir = os.environ.get(ENV_ARTIFACT_DIR)
    if not artifact_dir:
        raise RuntimeError(f"{ENV_ARTIFACT_DIR} is not set: it names the per-dataset artifact directory to serve")
    leave_signals_to_supervisor()
    return create_app(settings_from_env(), Path(artifact_dir))  # JSON logs: uvicorn's log_config (serve)


def server_env(settings: Settings | Path | None, artifact_dir: Path) -> dict[str, str]:
    """The environment variables ``app_from_env`` reads, for ``settings`` (object, YAML path or default)."""
    env = {ENV_ARTIFACT_DIR: str(Path(artifact_dir).resolve())}
    if isinstance(settings, Settings):
        data = settings.model_dump(mode="json")
        for name in ("admin_api_key", "debug_api_key"):  # model_dump masks secrets; workers need the real keys
            key = getattr(settings.serving, name)
            data["serving"][name] = key.get_secret_value() if key is not None else None
        env[ENV_SETTINGS_JSON] = json.dumps(data)
    elif settings is not None:
        env[ENV_CONFIG_PATH] = str(Path(settings).resolve())
    return env


def serve(
    settings: Settings, artifact_dir: Path, host: str | None = None, port: int | None = None, workers: int | None = None
) -> None:
    """Run the HTTP server until interrupted; unset arguments come from ``settings.serving``."""
    host = host or settings.serving.host
    port = port or settings.serving.port
    workers = workers or settings.serving.workers
    if workers < 1:
        raise ValueError(f"serve: workers must be >= 1, got {workers}")
    check_rules(settings, Path(artifact_dir))
    with exit_on_signals(), shared_state(settings, workers, Path(artifact_dir)) as settings:
        if workers == 1:
            server = DrainingServer(uvicorn.Config(create_app(settings, Path(artifact_dir)), host=host, port=port,
                                                   log_config=log_config(), proxy_headers=False))
            server.run()
            if server.received is None and not server.started:
                raise SystemExit(STARTUP_FAILURE)
            received = server.received
        else:
            os.environ.update({**server_env(settings, Path(artifact_dir)), ENV_SUPERVISOR_PID: str(os.getpid())})
            config = uvicorn.Config(APP_FACTORY, factory=True, host=host, port=port, workers=workers,
                                    log_config=log_config(), proxy_headers=False)
            supervisor = StoppingSupervisor(config, sockets=[bind_listener(config)])
            supervisor.run()
            received = supervisor.received
        if received is not None:  # drained and stopped: the embedded Redis stops as this block exits
            raise SystemExit(128 + received)


def bind_listener(config: uvicorn.Config) -> socket.socket:
    """``config.bind_socket()`` with Nagle's algorithm off (``TCP_NODELAY``, which accepted connections inherit).

    For several workers the socket is bound here, not by asyncio, and ``Config.bind_socket`` creates it
    without a protocol number: asyncio then leaves ``TCP_NODELAY`` off on its connections, and an answer
    written as two sends (headers, then body) waits for the client's delayed ACK, about 40 ms a request
    on Linux loopback against 2 ms with one worker.
    """
    sock = config.bind_socket()
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def serve_workers(app_factory: str, host: str, port: int, workers: int) -> None:
    """``workers`` uvicorn processes of ``app_factory`` behind uvicorn's supervisor, on ``bind_listener``'s socket:
    what ``python -m uvicorn --factory APP --workers N`` runs, without its Nagle delay (benchmarks, tests)."""
    config = uvicorn.Config(app_factory, factory=True, host=host, port=port, workers=workers, log_level="warning",
                            proxy_headers=False)
    Multiprocess(config, sockets=[bind_listener(config)]).run()


def check_rules(settings: Settings, artifact_dir: Path) -> None:
    """Refuse to start (``RulesError``, a ValueError naming the stage, rule and attribute) when a
    policy stage's rule set cannot judge this catalog: the workers would load, fail that
    fail-closed stage and answer 503 to every request while looking up."""
    for spec in settings.pipeline.stages:
        if spec.enabled and spec.kind in POLICY_KINDS:
            try:
                build_stage(spec, settings).load(artifact_dir)
            except ValueError as exc:
                raise type(exc)(f"stage {spec.name!r}: {exc}") from exc


def _signal_exits(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def exit_on_signals() -> Iterator[None]:
    """``STOP_SIGNALS`` end the process by ``SystemExit(128 + signum)`` outside the HTTP server's own
    handling (while the embedded Redis starts, say), so the ``finally`` blocks and ``atexit``
    handlers run: the default actions kill on the spot (SIGINT with a traceback), leaving the embedded
    redis-server of ``shared_state`` running as an orphan."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread owns signals
        yield
        return
    previous = {sig: signal.signal(sig, _signal_exits) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class DrainingServer(uvicorn.Server):
    """uvicorn's server (one worker) that also drains on SIGHUP (a closed terminal), as it does on SIGINT
    and SIGTERM, and keeps the first stop signal in ``received`` instead of raising it again once
    stopped: ``serve`` then exits ``128 + signum`` after its own clean-up (the embedded Redis)."""

    received: int | None = None

    @contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self._stop) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum if self.received is None else self.received
        self.handle_exit(signum, frame)  # a second SIGINT forces the exit, as in uvicorn


class StoppingSupervisor(Multiprocess):
    """uvicorn's worker supervisor, stopping (workers drained by SIGTERM) on SIGHUP as on SIGINT and
    SIGTERM, where uvicorn restarts the workers; keeps the first stop signal in ``received``."""

    received: int | None = None

    def handle_signals(self) -> None:
        for sig in self.signal_queue:
            if sig in STOP_SIGNALS and self.received is None:
                self.received = sig
        super().handle_signals()

    def handle_hup(self) -> None:
        self.should_exit.set()


def leave_signals_to_supervisor(environ: dict[str, str] | None = None) -> None:
    """In a worker of ``serve``'s supervisor, ignore SIGHUP and SIGINT: a closed terminal or Ctrl+C sends
    them to the whole process group, and the supervisor then drains and stops each worker with SIGTERM
    (workers stopping on their own would be restarted by it as crashed). The worker also asks for
    SIGTERM when the supervisor dies (``recsys.child_guard.die_with_parent``): a supervisor killed with
    SIGKILL leaves no worker serving, orphaned, on its port."""
    env = os.environ if environ is None else environ
    if env.get(ENV_SUPERVISOR_PID) == str(os.getppid()) and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        die_with_parent(int(env[ENV_SUPERVISOR_PID]))


@contextmanager
def shared_state(settings: Settings, workers: int, artifact_dir: Path) -> Iterator[Settings]:
    """Settings whose ``redis_url`` every worker shares (an embedded Redis for ``artifact_dir``, started once here).

    With ``workers > 1`` also sets ``PROMETHEUS_MULTIPROC_DIR`` (unless already set) to a
    fresh directory; both are cleaned up when the block exits.
    """
    embedded, metrics_dir = None, None
    try:
        if settings.resolve_redis_url() is None:
            embedded = embedded_redis(settings, artifact_dir)
            settings = settings.model_copy(update={"redis_url": embedded.start()})
        if workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            metrics_dir = tempfile.mkdtemp(prefix="recsys-metrics-")
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
        yield settings
    finally:
        if metrics_dir is not None:
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
            shutil.rmtree(metrics_dir, ignore_errors=True)
        if embedded is not None:
            embedded.close()


def recommend_once(
    settings: Settings,
    artifact_dir: Path,
    user_id: str,
    k: int | None = None,
    debug: bool = False,
    context: dict[str, Any] | None = None,
    explain: bool = False,
    explain_k: int | None = None,
) -> dict[str, Any]:
    """Load everything, answer one request in-process: the same JSON as POST /v1/recommend.

    With ``explain`` the model that writes reasons is loaded before the request (a server loads it
    in the background and serves template reasons meanwhile).

    Raises ``ValueError`` naming the field for input the API would refuse with 422, and
    ``recsys.pipeline.PipelineError`` when a fail-closed stage fails (the API's 503).
    """
    try:
        given: dict[str, Any] = {"k": k} if k is not None else {}  # omitted k: the API default, capped by max_k
        given |= {"explain": True, "explain_k": explain_k} if explain else {}
        body = RecommendRequest.model_validate({"user_id": user_id, "context": context, "debug": debug, **given})
    except ValidationError as exc:  # one line per bad field, as the 422 names them
        fields = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"invalid request: {fields}") from exc
    body = within_limits(body, settings)  # LimitError is a ValueError naming the field
    recommender = Recommender.load(settings, Path(artifact_dir))
    if explain:
        recommender.explanations.generator()  # the pipeline's LLM stage, else start loading the backbone
        recommender.explanations.start_loading(wait=True)
    return recommender.recommend(body)
