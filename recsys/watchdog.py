"""Stage calls bounded by the request's deadline: ``StageWatchdog`` runs a call on a daemon worker.

Python cannot stop a thread, so a stage call past its deadline is abandoned, not killed: the
pipeline (``recsys.pipeline``) stops waiting ``WATCHDOG_GRACE_S`` after the deadline and falls
back, and while ``MAX_ABANDONED`` calls of one stage are still stuck the stage is not tried at all,
so a hung backend costs a bounded number of threads and each request only its deadline.

The calls run on persistent daemon workers (``_Worker``), not on a thread started per call:
starting a thread costs more than the coarse ranker's whole call on a loaded box, while handing
a call to an idle worker is one queue put. A worker serves one call at a time and goes back to
the idle list when its call returns, abandoned or not; at most ``MAX_IDLE_WORKERS`` wait there.
Workers are daemon threads, so a hung call never keeps the process from exiting.
"""

from __future__ import annotations

import contextvars
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from recsys.contract import Candidates, Request, Stage

WATCHDOG_GRACE_S = 0.05  # lets a stage that checks its deadline stop itself and say why
MAX_ABANDONED = 4  # stuck calls per stage before it falls back without trying
MAX_IDLE_WORKERS = 16  # idle workers kept for the next calls; more concurrent calls start more


class StageAbandoned(RuntimeError):
    """A stage call did not return by its deadline (plus grace) and was left running."""


class _Call:
    """One stage call handed to a worker: its outcome and a lock released when it is known."""

    __slots__ = ("fn", "args", "out", "exc", "finished", "abandoned", "on_abandoned_end")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args
        self.out: Any = None
        self.exc: BaseException | None = None
        self.finished = threading.Lock()
        self.finished.acquire()  # released by the worker once out or exc is set
        self.abandoned = False
        self.on_abandoned_end: Callable[[], None] | None = None


class _Worker:
    """A daemon thread running the calls handed to it, one at a time, until it is not needed."""

    def __init__(self, pool: StageWatchdog) -> None:
        self.pool = pool
        self.inbox: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="stage-watchdog", daemon=True).start()

    def _loop(self) -> None:
        while True:
            call = self.inbox.get()
            try:
                call.out = call.fn(*call.args)
            except BaseException as exc:  # handed to the waiting request thread
                call.exc = exc
            with self.pool._lock:
                call.finished.release()
                if call.abandoned and call.on_abandoned_end is not None:
                    call.on_abandoned_end()
                del call  # drop the result before idling
                if len(self.pool._idle) >= self.pool.max_idle:
                    return
                self.pool._idle.append(self)


class StageWatchdog:
    """Runs a stage call on a daemon worker and stops waiting for it at the request's deadline.

    Python cannot kill a thread, so a hung call keeps its worker until it returns; ``stuck``
    counts those per stage and refuses new calls while ``max_abandoned`` are stuck, so a dead
    backend costs a bounded number of threads, and each request only its deadline.
    """

    def __init__(self, grace_s: float = WATCHDOG_GRACE_S, max_abandoned: int = MAX_ABANDONED,
                 max_idle: int = MAX_IDLE_WORKERS):
        self.grace_s, self.max_abandoned, self.max_idle = grace_s, max_abandoned, max_idle
        self.stuck: dict[str, int] = {}
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []

    def run(self, name: str, stage: Stage, request: Request, cands: Candidates) -> Candidates:
        if request.deadline is None:
            return stage.run(request, cands)
        with self._lock:
            if self.stuck.get(name, 0) >= self.max_abandoned:
                raise StageAbandoned(f"budget overrun: {self.stuck[name]} earlier calls still running (backend hung)")
            worker = self._idle.pop() if self._idle else None
        ctx = contextvars.copy_context()  # log lines of the call keep the request id
        call = _Call(ctx.run, (stage.run, request, cands))
        (worker or _Worker(self)).inbox.put(call)
        wait_s = max(0.0, request.deadline - time.monotonic()) + self.grace_s
        if not call.finished.acquire(timeout=wait_s):
            with self._lock:
                if not call.finished.acquire(blocking=False):  # still running: abandon it
                    call.abandoned = True
                    call.on_abandoned_end = lambda: self._release_stuck(name)
                    self.stuck[name] = self.stuck.get(name, 0) + 1
                    raise StageAbandoned(f"budget overrun: no answer {wait_s * 1000:.0f} ms after the call "
                                         "started (deadline + grace); call abandoned")
        if call.exc is not None:
            raise call.exc
        return call.out

    def _release_stuck(self, name: str) -> None:
        """An abandoned call of stage ``name`` returned (called with ``_lock`` held)."""
        self.stuck[name] -= 1
