"""Debug answers need a key; the console's requests are never logged as experiment impressions."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from recsys.experiments import ExperimentsConfig
from serving.app import create_app
from tests.serving.conftest import ADMIN_KEY, DEBUG_KEY, RECALL, RULES, client_for, toy_pipeline
from tests.serving.toy import AudienceRules, PopularityRecall, toy_settings

PAIRS = [(RECALL, PopularityRecall), (RULES, AudienceRules)]
DEBUG_BODY = {"user_id": "u1", "k": 3, "debug": True}


@pytest.mark.parametrize(("headers", "detail"), [
    ({}, "debug answers need X-API-Key: the admin key or serving.debug_api_key; send debug: false without one"),
    ({"X-API-Key": "not-the-key-at-all"}, "debug answers need X-API-Key"),
])
def test_debug_without_the_key_is_refused(toy_dir: Path, headers: dict[str, str], detail: str) -> None:
    """Anyone knowing a user id used to read which gate removed which item (their age band, risk tolerance)."""
    with client_for(toy_dir, PAIRS, admin_api_key=ADMIN_KEY, debug_api_key=DEBUG_KEY) as client:
        resp = client.post("/v1/recommend", json=DEBUG_BODY, headers=headers)
        assert resp.status_code == 403 and resp.json()["detail"].startswith(detail)
        plain = client.post("/v1/recommend", json={**DEBUG_BODY, "debug": False}, headers=headers)
        assert plain.status_code == 200 and "debug" not in plain.json()


@pytest.mark.parametrize("key", [ADMIN_KEY, DEBUG_KEY])
def test_the_admin_or_the_debug_key_opens_debug_answers(toy_dir: Path, key: str) -> None:
    with client_for(toy_dir, PAIRS, admin_api_key=ADMIN_KEY, debug_api_key=DEBUG_KEY) as client:
        resp = client.post("/v1/recommend", json=DEBUG_BODY, headers={"X-API-Key": key})
        assert resp.status_code == 200 and "removed" in resp.json()["debug"]


def test_the_debug_key_does_not_open_admin(toy_dir: Path) -> None:
    with client_for(toy_dir, PAIRS, admin_api_key=ADMIN_KEY, debug_api_key=DEBUG_KEY) as client:
        assert client.get("/admin/rules/versions", headers={"X-API-Key": DEBUG_KEY}).status_code == 401


def test_without_any_key_configured_debug_is_turned_off(toy_dir: Path) -> None:
    with client_for(toy_dir, PAIRS) as client:
        resp = client.post("/v1/recommend", json=DEBUG_BODY, headers={"X-API-Key": "anything-long-enough"})
        assert resp.status_code == 403
        assert resp.json()["detail"] == ("debug answers are turned off: configure serving.debug_api_key (or "
                                         "serving.admin_api_key) and send it as X-API-Key")


def test_console_requests_are_served_but_never_logged_as_impressions(toy_dir: Path) -> None:
    """The console's "Try a request" used to write real impressions into the experiment's stream."""
    settings = toy_settings(RECALL, RULES).model_copy(update={"experiments": ExperimentsConfig(enabled=True)})
    app = create_app(settings, toy_dir, pipeline=toy_pipeline(toy_dir, settings, PAIRS))
    with TestClient(app) as client:
        state = app.state.slot.recommender.online
        stream = f"{state.ns}:events"
        console = client.post("/v1/recommend", json={"user_id": "u1", "k": 3},
                              headers={"X-Recsys-Origin": "console"}).json()
        assert console["variant"] and console["impressions_logged"] is False and len(console["items"]) == 3
        assert state.client.xlen(stream) == 0
        served = client.post("/v1/recommend", json={"user_id": "u2", "k": 3}).json()
        assert served["impressions_logged"] is True and state.client.xlen(stream) == len(served["items"]) > 0
