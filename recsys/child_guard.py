"""Child processes that never outlive this process, even when it is killed with SIGKILL.

A server killed by ``kill -9`` runs no ``finally`` block and no ``atexit`` handler, so its
children would be orphaned. On Linux ``prctl(PR_SET_PDEATHSIG, SIGTERM)`` asks the kernel to
send the child SIGTERM when its parent dies. The kernel means the parent *thread*: the
signal fires when the thread that forked the child ends, not only the process. Children
started from a short-lived thread (a thread pool's worker, a supervisor thread that is
stopped and started again) would be killed when that thread ends, so every child is forked
by one daemon thread, ``spawn_thread``, that lives exactly as long as the process.

``popen(cmd, **kwargs)`` is ``subprocess.Popen`` run on that thread with the death signal
set; a child whose parent died before the signal was armed terminates itself at once.
Elsewhere than Linux there is no such signal: the child is started normally (``atexit``
still stops it on an ordinary exit).

``die_with_parent`` arms the same signal from inside a child another library started (uvicorn's
workers, spawned by its supervisor's main thread, which lives as long as the supervisor).

Deliberately left out: process groups and cgroups (a supervisor such as systemd already
stops a whole unit).
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _arm_death_signal(parent_pid: int) -> Callable[[], None]:
    """The ``preexec_fn`` of a child: SIGTERM when the forking thread dies; gone already if it has."""

    def preexec() -> None:
        if _LIBC is not None:
            _LIBC.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died between fork and prctl: nobody would signal us
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


class _SpawnThread:
    """One daemon thread that forks every guarded child; it ends only when the process does."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pid = 0

    def run(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` on the spawn thread (started on first use, and again in a forked child process)."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
                self._jobs = queue.SimpleQueue()
                self._thread = threading.Thread(target=self._loop, name="child-spawner", daemon=True)
                self._thread.start()
                self._pid = os.getpid()
            if threading.current_thread() is self._thread:
                return fn()
            done: Future[Any] = Future()
            self._jobs.put((fn, done))
        return done.result()

    def _loop(self) -> None:
        while True:
            fn, done = self._jobs.get()
            try:
                done.set_result(fn())
            except BaseException as exc:  # handed back to the caller, which raises it
                done.set_exception(exc)


spawn_thread = _SpawnThread()


def die_with_parent(parent_pid: int) -> None:
    """Ask for SIGKILL when this process's parent dies; die at once if it already has.

    For a child that another library starts (uvicorn's worker processes): it arms the signal
    itself, first thing. ``parent_pid`` is the parent it expects, so a worker that starts after
    its parent was killed does not keep running under init. SIGKILL, not SIGTERM: a worker still
    in its start-up handles SIGTERM only once start-up ends, which can wait on a Redis that died
    with the parent; and a parent killed without a drain leaves nothing for its workers to drain to.
    """
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGKILL)


def popen(cmd: list[str], **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen(cmd, **kwargs)`` for a child that receives SIGTERM when this process dies."""
    parent = os.getpid()
    return spawn_thread.run(lambda: subprocess.Popen(cmd, preexec_fn=_arm_death_signal(parent), **kwargs))
