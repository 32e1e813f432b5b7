"""What PUT /admin/rules refuses so that a compliance gate is never switched off by accident, and the ids
and names the API refuses by character (toy catalog, the real rules stage on the default rule set)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.serving.conftest import ADMIN_KEY, REAL_RULES, client_for
from tests.serving.toy import DEFAULT_GATES

AUTH = {"X-API-Key": ADMIN_KEY}
MATCHES_NOTHING = {"version": "oops-1", "rules": [
    {"id": "x", "kind": "blocklist", "items": {"item_ids": ["no-such-item"], "unknown_ids": "allow"}}]}


@pytest.fixture
def online(toy_dir: Path) -> Iterator[TestClient]:
    with client_for(toy_dir, REAL_RULES, admin_api_key=ADMIN_KEY) as c:
        yield c


def minor_sees(client: TestClient) -> list[str]:
    resp = client.post("/v1/recommend", json={"user_id": "stranger", "k": 5})  # no age: counts as a minor
    return [i["id"] for i in resp.json()["items"]]


def test_a_rule_set_dropping_the_gates_is_refused_naming_them_and_the_gates_keep_serving(online: TestClient) -> None:
    resp = online.put("/admin/rules", content=json.dumps(MATCHES_NOTHING), headers=AUTH)
    assert resp.status_code == 422
    detail = resp.json()["detail"]
    assert detail.startswith("PUT /admin/rules: version 'oops-1' drops gate(s) the active rule set enforces: "
                             "blocklist:withdrawn_items (rule 'withdrawn_items' of 'default-3'); audience_gate:adult")
    assert f"acknowledge_dropped_gates: {json.dumps(DEFAULT_GATES)}" in detail
    listed = online.get("/admin/rules/versions", headers=AUTH).json()
    assert listed["active"] == "default-3" and "oops-1" not in [v["version"] for v in listed["versions"]]
    assert "m4" not in minor_sees(online)  # the adult item stays away from a user of unknown age
    meant = {**MATCHES_NOTHING, "acknowledge_dropped_gates": DEFAULT_GATES}
    assert online.put("/admin/rules", content=json.dumps(meant), headers=AUTH).status_code == 200  # said so


def test_weakening_a_gate_counts_as_dropping_it(online: TestClient) -> None:
    doc = {"version": "weaker-1", "rules": [
        {"id": "withdrawn_items", "kind": "blocklist", "items": {"item_ids": ["withdrawn-0001"], "unknown_ids": "allow"}},
        {"id": "adult_gate", "kind": "audience_gate", "audience": "adult", "min_age": 13},
        {"id": "teen_gate", "kind": "audience_gate", "audience": "teen", "min_age": 13},
        {"id": "risk_tolerance", "kind": "risk_tolerance", "default_tolerance": 1}]}
    resp = online.put("/admin/rules", content=json.dumps(doc), headers=AUTH)
    assert resp.status_code == 422 and "drops gate(s) the active rule set enforces: audience_gate:adult" in resp.text


def test_a_blocklist_id_the_catalog_lacks_is_refused_with_the_close_one(online: TestClient) -> None:
    doc = {"version": "typo-1", "acknowledge_dropped_gates": DEFAULT_GATES,
           "rules": [{"id": "takedown", "kind": "blocklist", "items": {"item_ids": ["M4"]}}]}
    resp = online.put("/admin/rules", content=json.dumps(doc), headers=AUTH)
    assert resp.status_code == 422
    assert ("rule 'takedown' (rules[0]): no item has id 'M4' (did you mean 'm4'?) in this catalog"
            in resp.json()["detail"])


def test_a_rollback_that_drops_gates_needs_them_acknowledged(online: TestClient) -> None:
    meant = {**MATCHES_NOTHING, "acknowledge_dropped_gates": DEFAULT_GATES}
    assert online.put("/admin/rules", content=json.dumps(meant), headers=AUTH).status_code == 200
    back = online.post("/admin/rules/rollback", json={"version": "default-3"}, headers=AUTH)
    assert back.status_code == 422 and "blocklist:x" in back.json()["detail"]
    back = online.post("/admin/rules/rollback", json={"version": "default-3", "acknowledge_dropped_gates": ["blocklist:x"]},
                       headers=AUTH)
    assert back.status_code == 200 and back.json()["active"] == "default-3"


@pytest.mark.parametrize(("user", "says"), [
    ("u\U000e0041", "contains a tag character outside a subdivision flag (U+E0041 TAG LATIN CAPITAL LETTER A at 1)"),
    ("u\u2028x", "contains a line break character (U+2028 LINE SEPARATOR at 1)"),
])
def test_ids_with_a_stray_tag_or_a_line_separator_are_refused_naming_it(online: TestClient, user: str,
                                                                        says: str) -> None:
    for path, body in (("/v1/recommend", {"user_id": user, "k": 2}),
                       ("/v1/events", {"event_id": "e1", "user_id": user, "item_id": "m1", "type": "click"})):
        resp = online.post(path, json=body)
        assert resp.status_code == 422, (path, resp.text)
        assert [e["msg"] for e in resp.json()["detail"] if e["loc"][-1] == "user_id"] == [says]


def test_a_worker_that_has_not_polled_compares_gates_with_the_stored_active_rule_set(toy_dir: Path) -> None:
    """With two workers, a publish reaching the one that had not yet installed the previous publish dropped that
    publish's new gate unacknowledged: the check ran against the worker's own, older rule set."""
    with client_for(toy_dir, REAL_RULES, admin_api_key=ADMIN_KEY, versions_poll_s=60) as a, \
            client_for(toy_dir, REAL_RULES, admin_api_key=ADMIN_KEY, versions_poll_s=60) as b:
        base = {"rules": [
            {"id": "withdrawn_items", "kind": "blocklist",
             "items": {"item_ids": ["withdrawn-0001"], "unknown_ids": "allow"}},
            {"id": "adult_gate", "kind": "audience_gate", "audience": "adult", "min_age": 18},
            {"id": "teen_gate", "kind": "audience_gate", "audience": "teen", "min_age": 13},
            {"id": "risk_tolerance", "kind": "risk_tolerance", "default_tolerance": 1}]}
        extra = {"id": "extra_block", "kind": "blocklist", "items": {"item_ids": ["m1"]}}
        with_extra = {"version": "race-x-1", "rules": [*base["rules"], extra]}
        assert a.put("/admin/rules", content=json.dumps(with_extra), headers=AUTH).status_code == 200
        without = {"version": "race-y-1", **base}
        resp = b.put("/admin/rules", content=json.dumps(without), headers=AUTH)
        assert resp.status_code == 422 and "blocklist:extra_block" in resp.json()["detail"], resp.text
