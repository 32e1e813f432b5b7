from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import redis

from recsys.pipeline import Pipeline
from recsys.redis_client import RedisGuard
from rules.stage import RulesStage
from serving.document_reload import PromptApplier, RulesApplier, VersionWatcher, document_json
from serving.versioned import UnknownVersion, VersionConflict, VersionStore
from tests.serving.conftest import RULES, toy_pipeline
from tests.serving.toy import DEFAULT_GATES, PopularityRecall, toy_settings

BLOCK_M4 = {"version": "block-m4", "rules": [{"id": "no_m4", "kind": "blocklist", "items": {"item_ids": ["m4"]}}],
            "acknowledge_dropped_gates": DEFAULT_GATES}


@pytest.fixture
def store(redis_env: str) -> VersionStore:
    return VersionStore(redis.Redis.from_url(redis_env), RedisGuard(), f"t-{uuid.uuid4().hex}")


def test_publish_conflict_unchanged_rollback(store: VersionStore) -> None:
    assert store.active("rules") is None
    assert store.publish("rules", "v1", '{"a":1}').status == "created"
    assert store.publish("rules", "v2", '{"a":2}').status == "created"
    assert store.publish("rules", "v1", '{"a":1}').status == "unchanged" and store.active("rules") == "v1"
    with pytest.raises(VersionConflict, match="'v1'"):
        store.publish("rules", "v1", '{"a":3}')
    store.rollback("rules", "v2")
    assert store.active("rules") == "v2"
    with pytest.raises(UnknownVersion, match="'v9'"):
        store.rollback("rules", "v9")
    assert [(v.version, v.active) for v in store.versions("rules")] == [("v1", False), ("v2", True)]
    assert store.publish("rules", "v3", "{}", seed=True).status == "kept"
    assert store.versions("prompts") == []
    with pytest.raises(ValueError, match="unknown versioned kind"):
        store.active("features")


def test_watcher_seeds_the_served_rules_then_installs_and_rolls_back(store: VersionStore, toy_dir: Path) -> None:
    settings = toy_settings()
    pipe: Pipeline = toy_pipeline(toy_dir, settings, [(settings.pipeline.stages[0], PopularityRecall),
                                                      (RULES, RulesStage)])
    rules = RulesApplier(pipe)
    watcher = VersionWatcher(store, [rules, PromptApplier(pipe)], poll_s=0.1)
    watcher.sync_once()
    assert store.active("rules") == "default-3" == rules.applied  # the file's rule set, now rollback-able
    store.publish("rules", "block-m4", document_json(BLOCK_M4))  # as another worker's PUT would
    watcher.sync_once()
    assert pipe.stage("rules").version() == "block-m4"
    store.rollback("rules", "default-3")
    watcher.sync_once()
    assert pipe.stage("rules").version() == "default-3"
    store.publish("rules", "broken", '{"version": "broken", "rules": [{"id": "x", "kind": "nope"}]}')
    watcher.sync_once()  # an invalid stored document is logged and skipped: the old one keeps serving
    assert pipe.stage("rules").version() == "default-3"


def test_an_emptied_store_is_reseeded_with_what_the_worker_serves_not_the_start_up_file(
    store: VersionStore, toy_dir: Path
) -> None:
    """A restarted (empty) Redis must not put a run-time rule set back to the start-up file."""
    settings = toy_settings()
    pipe: Pipeline = toy_pipeline(toy_dir, settings, [(settings.pipeline.stages[0], PopularityRecall),
                                                      (RULES, RulesStage)])
    rules, prompts = RulesApplier(pipe), PromptApplier(pipe)
    watcher = VersionWatcher(store, [rules, prompts], poll_s=0.1)
    watcher.sync_once()
    store.publish("rules", "block-m4", document_json(BLOCK_M4))
    store.publish("prompts", "p-7", document_json({"version": "p-7", "system": "Rank films for this user."}))
    watcher.sync_once()
    assert pipe.stage("rules").version() == "block-m4" and prompts.applied == "p-7"
    store.client.flushall()  # what a kill -9 of the embedded redis-server leaves: nothing
    watcher.sync_once()
    assert store.active("rules") == "block-m4" == pipe.stage("rules").version()
    assert store.active("prompts") == "p-7"
    assert [v.version for v in store.versions("rules")] == ["block-m4"]
