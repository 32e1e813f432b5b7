"""Dynamic batching: concurrent requests' LLM work merged into shared forward passes.

Callers ``submit`` a job (payload, token length, deadline, priority) and wait on a future.
One worker thread takes the oldest job (priority lane first), waits at most ``window_ms``
for company, then runs ``run_batch`` on it plus the queued jobs of similar length (within
``length_bucket`` tokens, so padding stays small), up to ``max_batch``; the rest wait for the
next pass. A job whose deadline passes while queued is answered with ``StageError`` without
running, so the pipeline serves its fallback; a failing batch fails each of its jobs.

This is plain bookkeeping over ``threading`` and ``concurrent.futures``; the model call is
injected (``run_batch(payloads) -> results``, one result per payload in order).

Deliberately left out: preemption of a running batch, token-level continuous batching (vLLM
does that on GPU; scoring needs one forward pass per request, not a decode loop).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from recsys.contract import StageError


@dataclass
class Job:
    payload: Any
    length: int
    deadline: float | None
    priority: bool
    seq: int
    future: Future = field(default_factory=Future)


class DynamicBatcher:
    """Single worker thread merging jobs; ``close()`` stops it (pending jobs get StageError)."""

    def __init__(self, run_batch: Callable[[Sequence[Any]], Sequence[Any]], *, window_ms: float = 10.0,
                 max_batch: int = 8, length_bucket: int = 64, clock: Callable[[], float] = time.monotonic,
                 name: str = "llm-batcher"):
        if max_batch < 1 or window_ms < 0 or length_bucket < 1:
            raise ValueError(f"DynamicBatcher: need max_batch >= 1, window_ms >= 0, length_bucket >= 1; got "
                             f"{max_batch}, {window_ms}, {length_bucket}")
        self.run_batch = run_batch
        self.window_s, self.max_batch, self.length_bucket = window_ms / 1000, max_batch, length_bucket
        self.clock = clock
        self._queue: list[Job] = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._closed = False
        self.counts = {"jobs": 0, "batches": 0, "expired": 0, "failed": 0, "max_batch_seen": 0}
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, payload: Any, length: int, deadline: float | None = None, priority: bool = False) -> Future:
        """Queue one job; its future resolves to ``run_batch``'s result for ``payload``."""
        job = Job(payload, int(length), deadline, priority, next(self._seq))
        with self._cond:
            if self._closed:
                raise StageError("LLM batcher is closed")
            self._queue.append(job)
            self.counts["jobs"] += 1
            self._cond.notify()
        return job.future

    def _take(self) -> list[Job] | None:
        """Block until a batch is ready; None when closed."""
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            first = min(self._queue, key=lambda j: (not j.priority, j.seq))
            until = self.clock() + self.window_s
            while len(self._queue) < self.max_batch and not self._closed:
                left = until - self.clock()
                if left <= 0:
                    break
                self._cond.wait(left)
            similar = sorted((j for j in self._queue if abs(j.length - first.length) < self.length_bucket),
                             key=lambda j: (j is not first, not j.priority, j.seq))
            batch = similar[: self.max_batch]
            taken = {id(j) for j in batch}
            self._queue = [j for j in self._queue if id(j) not in taken]
            return batch

    def _loop(self) -> None:
        while (batch := self._take()) is not None:
            now = self.clock()
            live = []
            for job in batch:
                if job.deadline is not None and now >= job.deadline:
                    self.counts["expired"] += 1
                    job.future.set_exception(StageError(
                        f"LLM job deadline passed while queued ({(now - job.deadline) * 1000:.1f} ms late)"))
                elif job.future.set_running_or_notify_cancel():
                    live.append(job)
            if not live:
                continue
            self.counts["batches"] += 1
            self.counts["max_batch_seen"] = max(self.counts["max_batch_seen"], len(live))
            try:
                results = self.run_batch([j.payload for j in live])
                if len(results) != len(live):
                    raise RuntimeError(f"run_batch returned {len(results)} results for {len(live)} jobs")
            except Exception as exc:  # noqa: BLE001 - every waiting request must be answered
                self.counts["failed"] += len(live)
                for job in live:
                    job.future.set_exception(StageError(f"LLM batch failed: {type(exc).__name__}: {exc}"))
                continue
            for job, result in zip(live, results, strict=True):
                job.future.set_result(result)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            pending, self._queue = self._queue, []
            self._cond.notify_all()
        for job in pending:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(StageError("LLM batcher closed"))
        self._thread.join(timeout=5)

    def stats(self) -> dict[str, float]:
        with self._cond:
            return {**{k: float(v) for k, v in self.counts.items()}, "queued": float(len(self._queue))}
