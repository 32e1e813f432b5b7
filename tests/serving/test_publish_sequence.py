"""Publishes that stick: activation sequences, re-seeding a restarted Redis, a publish into a stalled Redis."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from recsys.pipeline import Pipeline
from recsys.redis_client import RedisGuard, RedisUnavailable, connect
from recsys.redis_server import EmbeddedRedis
from rules.stage import RulesStage
from serving.app import create_app
from serving.document_reload import PromptApplier, RulesApplier, VersionWatcher, document_json
from serving.versioned import PublishUnconfirmed, VersionStore
from tests.serving.conftest import ADMIN_KEY, REAL_RULES, RULES, toy_pipeline
from tests.serving.toy import DEFAULT_GATES, PopularityRecall, toy_settings

BLOCK_M4 = {"version": "block-m4", "rules": [{"id": "no_m4", "kind": "blocklist", "items": {"item_ids": ["m4"]}}],
            "acknowledge_dropped_gates": DEFAULT_GATES}


class Worker:
    """One worker's pipeline, appliers and watcher on a shared store (what each uvicorn worker holds)."""

    def __init__(self, store: VersionStore, toy_dir: Path):
        settings = toy_settings()
        self.pipe: Pipeline = toy_pipeline(toy_dir, settings, [(settings.pipeline.stages[0], PopularityRecall),
                                                               (RULES, RulesStage)])
        self.rules = RulesApplier(self.pipe)
        self.watcher = VersionWatcher(store, [self.rules, PromptApplier(self.pipe)], poll_s=60)
        self.store = store

    def serves(self) -> str:
        return self.pipe.stage("rules").version()

    def publish(self, doc: dict) -> None:
        """What ``PUT /admin/rules`` does in this worker: store with a sequence, then install."""
        version, parsed = self.rules.validate(doc, "test")
        done = self.store.publish("rules", version, document_json(doc), floor=self.rules.seq)
        assert self.watcher.install("rules", version, parsed, doc, done.seq)


@pytest.fixture
def store(redis_env: str) -> VersionStore:
    return VersionStore(redis.Redis.from_url(redis_env), RedisGuard(), f"t-{uuid.uuid4().hex}")


def test_a_worker_that_had_not_polled_cannot_revert_a_publish_after_redis_lost_everything(
    store: VersionStore, toy_dir: Path
) -> None:
    a, b = Worker(store, toy_dir), Worker(store, toy_dir)
    a.watcher.sync_once(), b.watcher.sync_once()  # both on the start-up file, seeded once
    a.publish(BLOCK_M4)
    assert (a.serves(), b.serves()) == ("block-m4", "default-3")  # b has not polled yet
    store.client.flushall()  # what a kill -9 of the embedded redis-server leaves: nothing
    b.watcher.sync_once()  # b polls first: seeds what it serves, the older version
    a.watcher.sync_once()  # a serves a higher sequence: it re-seeds its own over it, never installs the older
    b.watcher.sync_once()
    assert (a.serves(), b.serves(), store.active("rules")) == ("block-m4", "block-m4", "block-m4")


def test_a_worker_never_installs_a_lower_sequence_than_its_own(store: VersionStore, toy_dir: Path) -> None:
    a = Worker(store, toy_dir)
    a.watcher.sync_once()
    a.publish(BLOCK_M4)
    seq = a.rules.seq
    version, parsed = a.rules.validate(json.loads(document_json(BLOCK_M4)) | {"version": "older"}, "test")
    assert not a.watcher.install("rules", "older", parsed, None, seq - 1)  # e.g. a slow poll's stale read
    assert a.serves() == "block-m4" and a.rules.seq == seq


def test_sequences_grow_across_a_redis_that_lost_everything(store: VersionStore) -> None:
    first = store.publish("rules", "v1", '{"a":1}')
    store.client.flushall()
    second = store.publish("rules", "v2", '{"a":2}')  # a fresh store: the clock keeps it above the old one
    assert second.seq > first.seq
    assert store.publish("rules", "v1", '{"a":1}', floor=second.seq + 10**12).seq > second.seq + 10**12  # above a floor
    kept = store.publish("rules", "v0", '{"a":0}', floor=first.seq, seed=True)  # a re-seed never overwrites a higher
    assert kept.status == "kept" and store.active("rules") == "v1"


@pytest.fixture
def stallable() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis()
    server.start()
    yield server
    if server.proc is not None:
        os.kill(server.proc.pid, signal.SIGCONT)
    server.close()


class StallAfterTheClockRead(VersionStore):
    """A real store whose Redis stalls (SIGSTOP) right after the publish read its clock: the worst moment,
    the publish script then sits in the socket until the stall ends."""

    def __init__(self, server: EmbeddedRedis):
        super().__init__(connect(server.url, 0.25), RedisGuard(0.01, 0.01), "stall")
        self.server, self.stall = server, False

    def _deadline(self) -> str:
        deadline = super()._deadline()
        if self.stall and self.server.proc is not None:
            os.kill(self.server.proc.pid, signal.SIGSTOP)
        return deadline


def test_a_publish_sent_into_a_stalled_redis_fails_and_is_not_applied_when_the_stall_ends(
    stallable: EmbeddedRedis,
) -> None:
    store = StallAfterTheClockRead(stallable)
    store.publish("rules", "v1", '{"a":1}')
    store.stall = True
    assert stallable.proc is not None
    try:
        with pytest.raises(PublishUnconfirmed, match="GET /admin/rules/versions shows the active version"):
            store.publish("rules", "v2", '{"a":2}')
        time.sleep(0.3)  # the stall outlasts the deadline the publish carried
    finally:
        os.kill(stallable.proc.pid, signal.SIGCONT)
    time.sleep(0.3)  # Redis now runs the script it held: past its deadline, it changes nothing
    store.guard.reset()
    assert store.active("rules") == "v1" and store.document("rules", "v2") is None  # nothing half-written


def test_a_publish_to_a_redis_already_stalled_sends_nothing(stallable: EmbeddedRedis) -> None:
    store = VersionStore(connect(stallable.url, 0.25), RedisGuard(0.01, 0.01), "stall")
    store.publish("rules", "v1", '{"a":1}')
    assert stallable.proc is not None
    os.kill(stallable.proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(RedisUnavailable) as err:
            store.publish("rules", "v2", '{"a":2}')
        assert not isinstance(err.value, PublishUnconfirmed)  # the clock read failed: nothing was sent
    finally:
        os.kill(stallable.proc.pid, signal.SIGCONT)
    time.sleep(0.1)
    store.guard.reset()
    assert store.active("rules") == "v1"


def test_the_admin_route_answers_503_and_the_old_version_keeps_serving(toy_dir: Path, stallable: EmbeddedRedis,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", stallable.url)
    settings = toy_settings(*(spec for spec, _ in REAL_RULES), admin_api_key=ADMIN_KEY, redis_retry_min_s=0.01,
                            redis_retry_max_s=0.01)
    auth = {"X-API-Key": ADMIN_KEY}
    with TestClient(create_app(settings, toy_dir, pipeline=toy_pipeline(toy_dir, settings, REAL_RULES))) as client:
        assert stallable.proc is not None
        os.kill(stallable.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(0.05)
            put = client.put("/admin/rules", content=json.dumps(BLOCK_M4), headers=auth)
            time.sleep(0.3)
        finally:
            os.kill(stallable.proc.pid, signal.SIGCONT)
        assert put.status_code == 503
        assert "GET /admin/rules/versions" in put.json()["detail"] or "nothing was changed" in put.json()["detail"]
        time.sleep(0.3)
        listed = client.get("/admin/rules/versions", headers=auth).json()
        assert (listed["active"], listed["serving"]) == ("default-3", "default-3")
        assert "block-m4" not in [v["version"] for v in listed["versions"]]
