"""Dynamic batching bookkeeping (no model), then the stage's batched path on a tiny model."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from cascade.settings import Settings
from llm_rerank.batching import DynamicBatcher
from llm_rerank.stage import LLMRerankStage
from recsys.config import StageSpec
from recsys.contract import Request, StageError
from tests.llm_rerank.factories import save_tiny_llm, tiny_split


class Recorder:
    """run_batch that doubles each payload and records the batches it saw."""

    def __init__(self, hold: threading.Event | None = None):
        self.batches: list[list[int]] = []
        self.hold = hold

    def __call__(self, payloads: list[int]) -> list[int]:
        if self.hold is not None:
            self.hold.wait(5)
        self.batches.append(list(payloads))
        return [2 * p for p in payloads]


def test_concurrent_jobs_share_batches_and_keep_their_own_results() -> None:
    rec = Recorder()
    batcher = DynamicBatcher(rec, window_ms=10, max_batch=8)
    try:
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda p: batcher.submit(p, length=10).result(timeout=5), range(32)))
    finally:
        batcher.close()
    assert results == [2 * p for p in range(32)]
    assert sorted(p for b in rec.batches for p in b) == list(range(32))
    assert max(len(b) for b in rec.batches) > 1 and all(len(b) <= 8 for b in rec.batches)


def test_length_groups_priority_lane_and_expired_deadlines() -> None:
    gate = threading.Event()
    rec = Recorder(hold=gate)
    batcher = DynamicBatcher(rec, window_ms=0, max_batch=8, length_bucket=16)
    try:
        blocker = batcher.submit(0, length=1)  # occupies the worker until the gate opens
        time.sleep(0.05)
        short = [batcher.submit(p, length=20) for p in (1, 2)]
        long = batcher.submit(3, length=400)
        urgent = batcher.submit(4, length=400, priority=True)
        expired = batcher.submit(5, length=20, deadline=time.monotonic() - 0.001)
        gate.set()
        assert [f.result(timeout=5) for f in short] == [2, 4] and long.result(5) == 6 and urgent.result(5) == 8
        assert blocker.result(5) == 0
        with pytest.raises(StageError, match="deadline passed while queued"):
            expired.result(timeout=5)
    finally:
        batcher.close()
    assert rec.batches[0] == [0]
    assert rec.batches[1] == [4, 3]  # the priority lane goes first, with its length group only
    assert rec.batches[2] == [1, 2]  # the 20-token jobs never share a pass with the 400-token ones
    assert batcher.stats()["expired"] == 1


def test_failing_batch_answers_every_job_with_stage_error() -> None:
    def broken(payloads: list[int]) -> list[int]:
        raise RuntimeError("out of memory")

    batcher = DynamicBatcher(broken, window_ms=1)
    try:
        with pytest.raises(StageError, match="out of memory"):
            batcher.submit(1, length=1).result(timeout=5)
    finally:
        batcher.close()
    with pytest.raises(StageError, match="closed"):
        batcher.submit(1, length=1)


def test_batched_stage_matches_unbatched_and_honours_deadlines(tmp_path: Path) -> None:
    """Four requests of different prompt lengths share padded passes and score as they do alone.

    The first batch is held until all four jobs are queued, so mixed-length rows always share a
    pass (not only when the threads happen to be quick). Concurrent requests must not race on the
    tokenizer's shared ``split_special_tokens`` state (``llm_rerank.prompt``): when they did, they
    built different prompts and scored differently (-2.07 vs -2.57); padding alone does not change
    a score (``test_forward``'s mixed-length test).
    """
    save_tiny_llm(tmp_path / "m")
    tiny_split().save(tmp_path / "toy" / "split")

    def stage(batching: bool) -> LLMRerankStage:
        settings = Settings.build({"artifacts_dir": str(tmp_path), "llm": {
            "model": str(tmp_path / "m"), "precision": "fp32", "candidates": 5,
            "batching": {"enabled": batching, "window_ms": 10, "max_batch": 4, "length_bucket": 1024}}})
        s = LLMRerankStage(StageSpec(name="llm", kind="llm"), settings.llm,
                           artifacts_root=settings.artifacts_dir)
        s.load(tmp_path / "toy")
        return s

    batched, plain = stage(True), stage(False)
    requests = [Request(user_id=f"u{u}", history=np.array(h)) for u, h in
                enumerate([[0, 1], [6, 7, 8, 9], [2], [10, 11, 3, 4, 5]])]
    items = np.array([0, 3, 6, 9, 11])
    lengths = {len(batched.build_prompt(r, items).prefix) for r in requests}
    assert len(lengths) == 4  # four different prompt lengths: rows are padded in the shared pass
    gate = threading.Event()
    batcher = batched.local().batcher
    assert batcher is not None
    run_batch = batcher.run_batch

    def held(jobs: list) -> list:
        gate.wait(30)
        return run_batch(jobs)

    batcher.run_batch = held
    try:
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(batched.score, r, items) for r in requests]
            for _ in range(3000):
                if batched.cache_stats()["batch_jobs"] == 4:
                    break
                time.sleep(0.01)
            gate.set()
            got = [f.result(timeout=60) for f in futures]
        for request, scores in zip(requests, got, strict=True):
            np.testing.assert_allclose(scores, plain.score(request, items), rtol=0, atol=1e-4)
        assert batched.cache_stats()["batch_max_batch_seen"] >= 2  # rows of different lengths shared a pass
        late = Request(user_id="u9", history=np.array([0]), deadline=time.monotonic() - 0.01)
        with pytest.raises(StageError, match="deadline"):
            batched.score(late, items)
    finally:
        gate.set()
        batched.close()
