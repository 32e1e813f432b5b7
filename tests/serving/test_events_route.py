"""What POST /v1/events stores when no experiment runs."""

from __future__ import annotations

from fastapi.testclient import TestClient


def test_a_variant_sent_while_no_experiment_runs_is_not_stored(online: TestClient) -> None:
    """It used to be stored, and a later `recsys ab analyze` counted it as an arm the server never assigned."""
    event = {"event_id": "ev-variant-off", "user_id": "u1", "item_id": "m4", "type": "click", "variant": "treatment"}
    resp = online.post("/v1/events", json=event)
    assert resp.status_code == 200 and resp.json()["status"] == "accepted"
    state = online.app.state.slot.recommender.online  # type: ignore[attr-defined]
    [(_, fields)] = state.client.xrange(f"{state.ns}:events")
    assert fields[b"type"] == b"click" and b"variant" not in fields and b"experiment" not in fields
