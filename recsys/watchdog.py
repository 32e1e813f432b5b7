"""Stage calls bounded by the request's deadline: ``StageWatchdog`` runs a call on a daemon thread.

Python cannot stop a thread, so a stage call past its deadline is abandoned, not killed: the
pipeline (``recsys.pipeline``) stops waiting ``WATCHDOG_GRACE_S`` after the deadline and falls
back, and while ``MAX_ABANDONED`` calls of one stage are still stuck the stage is not tried at all,
so a hung backend costs a bounded number of threads and each request only its deadline.
"""

from __future__ import annotations

import contextvars
import threading
import time

from recsys.contract import Candidates, Request, Stage

WATCHDOG_GRACE_S = 0.05  # lets a stage that checks its deadline stop itself and say why
MAX_ABANDONED = 4  # stuck calls per stage before it falls back without trying


class StageAbandoned(RuntimeError):
    """A stage call did not return by its deadline (plus grace) and was left running."""


class StageWatchdog:
    """Runs a stage call on a daemon thread and stops waiting for it at the request's deadline.

    Python cannot kill a thread, so a hung call keeps its thread until it returns; ``stuck``
    counts those per stage and refuses new calls while ``max_abandoned`` are stuck, so a dead
    backend costs a bounded number of threads, and each request only its deadline.
    """

    def __init__(self, grace_s: float = WATCHDOG_GRACE_S, max_abandoned: int = MAX_ABANDONED):
        self.grace_s, self.max_abandoned = grace_s, max_abandoned
        self.stuck: dict[str, int] = {}
        self._lock = threading.Lock()

    def run(self, name: str, stage: Stage, request: Request, cands: Candidates) -> Candidates:
        if request.deadline is None:
            return stage.run(request, cands)
        with self._lock:
            if self.stuck.get(name, 0) >= self.max_abandoned:
                raise StageAbandoned(f"budget overrun: {self.stuck[name]} earlier calls still running (backend hung)")
        box: dict[str, object] = {}
        done = threading.Event()
        ctx = contextvars.copy_context()  # log lines of the call keep the request id

        def call() -> None:
            try:
                box["out"] = ctx.run(stage.run, request, cands)
            except BaseException as exc:  # handed to the waiting request thread below
                box["exc"] = exc
            finally:
                done.set()
                with self._lock:
                    if box.get("abandoned"):
                        self.stuck[name] -= 1

        threading.Thread(target=call, name=f"stage-{name}", daemon=True).start()
        wait_s = max(0.0, request.deadline - time.monotonic()) + self.grace_s
        if not done.wait(wait_s):
            with self._lock:
                if not done.is_set():  # still running: abandon it
                    box["abandoned"] = True
                    self.stuck[name] = self.stuck.get(name, 0) + 1
                    raise StageAbandoned(f"budget overrun: no answer {wait_s * 1000:.0f} ms after the call "
                                         "started (deadline + grace); call abandoned")
        if "exc" in box:
            raise box["exc"]  # type: ignore[misc]
        return box["out"]  # type: ignore[return-value]
