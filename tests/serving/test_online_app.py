"""The online features over HTTP: events, result cache, admin versions, metrics, Redis outage.

Toy catalog (tests/serving/toy.py) with the real rules stage on rules/rulesets/default.yaml
(version default-3). u1 (30, risk tolerance 1) has seen m1 m2 m3, so popularity answers
m4 m5 m6; a click on m4 excludes it next time.
"""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient

from serving.schemas import RecommendResponse
from tests.serving.conftest import ADMIN_KEY, DEBUG, REAL_RULES, RECALL, client_for
from tests.serving.toy import DEFAULT_GATES, MissingArtifactsLLM

AUTH = {"X-API-Key": ADMIN_KEY}
BLOCK_M4 = {"version": "block-m4", "rules": [{"id": "no_m4", "kind": "blocklist", "items": {"item_ids": ["m4"]}}],
            "acknowledge_dropped_gates": DEFAULT_GATES}


def ids(client: TestClient, user: str = "u1", **body: object) -> tuple[list[str], dict]:
    data = client.post("/v1/recommend", json={"user_id": user, "k": 3, **body}, headers=DEBUG).json()
    return [i["id"] for i in data["items"]], data


def event(client: TestClient, event_id: str, item: str = "m4", kind: str = "click", user: str = "u1"):
    return client.post("/v1/events", json={"event_id": event_id, "user_id": user, "item_id": item, "type": kind})


def test_event_changes_the_next_recommendation_and_retires_the_cache(online: TestClient) -> None:
    first, data = ids(online)
    assert first == ["m4", "m5", "m6"] and data["path"] == "light" and data["degraded"] is False
    again, data = ids(online)
    assert again == first and data["path"] == "cache"
    RecommendResponse.model_validate(data)
    resp = event(online, "ev-1")
    assert resp.status_code == 200
    assert resp.json() | {"stream_id": None} == {"event_id": "ev-1", "status": "accepted", "appended_to_history": True,
                                                  "history_version": 1, "stream_id": None}
    after, data = ids(online)
    assert after == ["m5", "m6"] and data["path"] == "light"  # new history version: recomputed


def test_a_stranger_with_an_event_is_no_longer_a_cold_start(online: TestClient) -> None:
    assert ids(online, user="walk-in")[1]["cold_start"] is True
    assert event(online, "ev-walk-in", item="m2", user="walk-in").json()["appended_to_history"] is True
    items, data = ids(online, user="walk-in")
    assert data["cold_start"] is False and "m2" not in items


def test_duplicate_and_impression_events(online: TestClient) -> None:
    assert event(online, "ev-2").json()["status"] == "accepted"
    dup = event(online, "ev-2").json()
    assert (dup["status"], dup["appended_to_history"], dup["history_version"]) == ("duplicate", False, None)
    imp = event(online, "ev-3", item="m5", kind="impression").json()
    assert (imp["status"], imp["appended_to_history"]) == ("accepted", False)
    assert ids(online)[0] == ["m5", "m6"]


@pytest.mark.parametrize(("body", "loc"), [
    ({"item_id": "nope"}, ["body", "item_id"]),
    ({"type": "hover"}, ["body", "type"]),
    ({"event_id": ""}, ["body", "event_id"]),
    ({"event_id": "has space"}, ["body", "event_id"]),
    ({"variant": "a\nb"}, ["body", "variant"]),  # it goes into the events stream `recsys ab analyze` reads
    ({"variant": "b\u200b"}, ["body", "variant"]),
    ({"user_id": "u\u200b1"}, ["body", "user_id"]),
])
def test_invalid_event_is_422_naming_the_field(online: TestClient, body: dict, loc: list[str]) -> None:
    full = {"event_id": "e", "user_id": "u1", "item_id": "m4", "type": "click", **body}
    resp = online.post("/v1/events", json=full)
    assert resp.status_code == 422 and [e["loc"] for e in resp.json()["detail"]] == [loc]


def test_an_unreadable_cache_entry_is_a_miss_not_a_500(online: TestClient) -> None:
    first, data = ids(online)
    state = online.app.state.slot.recommender.online  # type: ignore[attr-defined]
    keys = state.client.keys(f"{state.ns}:result:*")
    assert len(keys) == 1
    for garbage in ('{"items": "not a list"}', "[1, 2]"):  # an older schema's entry, or not ours at all
        state.client.set(keys[0], garbage)
        again, data = ids(online)
        assert again == first and data["path"] == "light"  # recomputed (and stored afresh)
        RecommendResponse.model_validate(data)
    assert ids(online)[1]["path"] == "cache"


def test_debug_requests_bypass_the_cache(online: TestClient) -> None:
    assert [ids(online, debug=True)[1]["path"] for _ in range(2)] == ["light", "light"]


def test_answers_cached_under_one_config_are_not_served_under_another(toy_dir) -> None:
    with client_for(toy_dir, REAL_RULES) as first:
        ids(first)
    with client_for(toy_dir, REAL_RULES) as same:
        assert ids(same)[1]["path"] == "cache"  # one Redis: the cache outlives the process that filled it
    # the same trained files under another recall depth answer differently: the old answers must not be served
    shallow = [(RECALL.model_copy(update={"depth": 2}), REAL_RULES[0][1]), REAL_RULES[1]]
    with client_for(toy_dir, shallow) as other:
        assert ids(other)[1]["path"] == "light"
    # ... while a replica that differs only in where it listens shares them
    with client_for(toy_dir, REAL_RULES, port=8123, ready_timeout_s=61.0) as replica:
        assert ids(replica)[1]["path"] == "cache"


def test_admin_needs_the_key(online: TestClient, toy_dir) -> None:
    assert online.get("/admin/rules/versions").status_code == 401
    assert online.get("/admin/rules/versions", headers={"X-API-Key": "wrong"}).status_code == 401
    with client_for(toy_dir, REAL_RULES) as no_admin:
        assert no_admin.get("/admin/rules/versions", headers=AUTH).status_code == 503


def test_rule_change_and_rollback_take_effect_at_once(online: TestClient) -> None:
    listed = online.get("/admin/rules/versions", headers=AUTH).json()
    assert (listed["active"], listed["serving"], [v["version"] for v in listed["versions"]]) == (
        "default-3", "default-3", ["default-3"])
    put = online.put("/admin/rules", content=json.dumps(BLOCK_M4), headers=AUTH)
    assert put.status_code == 200 and put.json()["status"] == "created"
    items, data = ids(online)
    assert items == ["m5", "m6"] and data["versions"]["rules"] == "block-m4" and data["path"] == "light"
    back = online.post("/admin/rules/rollback", json={"version": "default-3"}, headers=AUTH)
    assert back.status_code == 422 and "blocklist:no_m4" in back.json()["detail"]  # it drops block-m4's blocklist
    back = online.post("/admin/rules/rollback", json={"version": "default-3", "acknowledge_dropped_gates": [
        "blocklist:no_m4"]}, headers=AUTH)
    assert back.status_code == 200
    items, data = ids(online)
    assert items == ["m4", "m5", "m6"] and data["versions"]["rules"] == "default-3"
    assert online.post("/admin/rules/rollback", json={"version": "v404"}, headers=AUTH).status_code == 404
    other = {**BLOCK_M4, "description": "same version, other rules"}
    assert online.put("/admin/rules", content=json.dumps(other), headers=AUTH).status_code == 409


def test_invalid_rule_set_is_refused_and_the_old_one_keeps_serving(online: TestClient) -> None:
    bad = "version: bad-1\nrules:\n  - {id: gate, kind: audience_gate, audience: adult, min_age: old}\n"
    resp = online.put("/admin/rules", content=bad, headers=AUTH)
    assert resp.status_code == 422 and "gate" in resp.json()["detail"]
    assert online.put("/admin/rules", content=b"[1, 2", headers=AUTH).status_code == 422
    items, data = ids(online)
    assert items == ["m4", "m5", "m6"] and data["versions"]["rules"] == "default-3"
    assert [v["version"] for v in online.get("/admin/rules/versions", headers=AUTH).json()["versions"]] == [
        "default-3"]


def test_prompt_versions_are_stored_and_reported(online: TestClient) -> None:
    put = online.put("/admin/prompts", content="version: p-2\nsystem: You rank films.\n", headers=AUTH)
    assert put.json() == {"kind": "prompts", "version": "p-2", "status": "created", "active": "p-2",
                          "sequence": put.json()["sequence"]}
    assert ids(online)[1]["versions"]["prompt"] == "p-2"
    hashed = online.put("/admin/prompts", content='{"system": "Rank."}', headers=AUTH).json()["version"]
    assert hashed.startswith("sha-")
    online.post("/admin/prompts/rollback", json={"version": "p-2"}, headers=AUTH)
    assert ids(online)[1]["versions"]["prompt"] == "p-2"


def test_metrics_and_request_id(online: TestClient) -> None:
    ids(online)
    ids(online)
    resp = online.post("/v1/recommend", json={"user_id": "u2"}, headers={"X-Request-ID": "req-7"})
    assert resp.headers["X-Request-ID"] == "req-7" and resp.json()["request_id"] == "req-7"
    assert len(online.get("/healthz").headers["X-Request-ID"]) == 32
    text = online.get("/metrics").text
    assert 'recsys_requests_total{path="cache"} 1.0' in text
    assert 'recsys_requests_total{path="light"} 2.0' in text
    assert 'recsys_result_cache_total{outcome="hit"} 1.0' in text
    assert 'recsys_stage_seconds_count{stage="rules"} 2.0' in text


def test_redis_down_serves_degraded_light_path_then_recovers(online: TestClient, redis_server) -> None:
    assert event(online, "ev-9").status_code == 200  # u1 clicked m4: Redis knows, the split does not
    redis_server.stop()
    try:
        answers = [ids(online) for _ in range(3)]
        assert all(data["degraded"] and data["path"] == "light" for _, data in answers)
        assert answers[0][0] == ["m4", "m5", "m6"]  # split histories: the click is not visible
        assert event(online, "ev-10").status_code == 503
        assert online.get("/readyz").json()["redis"] is False
        assert "recsys_degraded_requests_total 3.0" in online.get("/metrics").text
    finally:
        redis_server.start()  # a new, empty Redis (no persistence)
    deadline = time.monotonic() + 10
    while (data := ids(online)[1])["degraded"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert data["degraded"] is False and data["versions"]["rules"] == "default-3"
    assert event(online, "ev-11").status_code == 200
    assert ids(online)[0] == ["m5", "m6"]


def test_llm_without_artifacts_is_disabled_and_requests_take_the_light_path(
    toy_dir, toy_kinds: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cascade.registry import STAGE_KINDS
    from recsys.config import StageSpec
    from serving.app import create_app
    from tests.serving.conftest import RECALL, RULES
    from tests.serving.toy import toy_settings

    monkeypatch.setitem(STAGE_KINDS, "llm", MissingArtifactsLLM)
    settings = toy_settings(RECALL, StageSpec(name="llm", kind="llm"), RULES, llm_share=1.0)
    with TestClient(create_app(settings, toy_dir)) as client:
        deadline = time.monotonic() + 20
        while client.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.02)
        items, data = ids(client, llm=True)
    assert (data["path"], data["route"]) == ("light", "llm_unavailable") and items == ["m4", "m5", "m6"]
    assert [(s["name"], s["status"]) for s in data["stages"]][1] == ("llm", "skipped")


def test_llm_that_fails_falls_back_and_is_not_cached(toy_dir) -> None:
    from recsys.config import StageSpec
    from tests.serving.conftest import RECALL, RULES
    from tests.serving.toy import AudienceRules, FailingStage, PopularityRecall

    pairs = [(RECALL, PopularityRecall), (StageSpec(name="llm", kind="llm"), FailingStage), (RULES, AudienceRules)]
    with client_for(toy_dir, pairs, llm_share=1.0) as client:
        answers = [ids(client)[1] for _ in range(2)]
    assert [(d["path"], d["route"], d["fallbacks"]) for d in answers] == [("fallback", "share", ["llm"])] * 2
    assert [i["id"] for i in answers[0]["items"]] == ["m4", "m5", "m6"]  # recall's order kept


def test_read_traffic_from_new_user_ids_leaves_no_permanent_key(online: TestClient, redis_env: str, toy_dir) -> None:
    """A request with a new user id writes no ``hver`` key without expiry."""
    import redis

    ns = toy_dir.name
    r = redis.Redis.from_url(redis_env)

    def permanent() -> set[bytes]:
        return {k for k in r.scan_iter(f"{ns}:*") if r.pttl(k) == -1}

    ids(online)  # warm up: a known user (seeded) and the rules/prompt version keys
    before = permanent()
    for n in range(200):
        assert online.post("/v1/recommend", json={"user_id": f"visitor-{n}", "k": 3}).status_code == 200
    assert permanent() == before  # only result-cache entries were added, and they expire
    assert not [k for k in r.scan_iter(f"{ns}:*") if b"visitor-" in k]


def test_an_empty_variant_still_means_none_given(online: TestClient) -> None:
    resp = online.post("/v1/events", json={"event_id": "ev-empty-variant", "user_id": "u1", "item_id": "m4",
                                           "type": "click", "variant": ""})
    assert resp.status_code == 200 and resp.json()["status"] == "accepted"
    state = online.app.state.slot.recommender.online
    fields = state.client.xrange(f"{state.ns}:events")[-1][1]
    assert fields[b"type"] == b"click" and b"variant" not in fields  # not an arm named "" for `ab analyze`


def test_with_an_experiment_running_a_click_is_credited_to_the_users_own_arm_only(toy_dir) -> None:
    """A client cannot name an arm (even one that does not exist) and have `ab analyze` credit it with
    the click."""
    from recsys.experiments import ExperimentsConfig, VariantSpec, assign
    from serving.app import create_app
    from tests.serving.conftest import REAL_RULES, toy_pipeline
    from tests.serving.toy import toy_settings

    experiments = ExperimentsConfig(enabled=True, name="exp-1", holdout=0.1, variants=[
        VariantSpec(name="control", share=0.45), VariantSpec(name="treatment", share=0.45)])
    settings = toy_settings(*(spec for spec, _ in REAL_RULES), admin_api_key=ADMIN_KEY).model_copy(
        update={"experiments": experiments})
    with TestClient(create_app(settings, toy_dir, pipeline=toy_pipeline(toy_dir, settings, REAL_RULES))) as client:
        arm = assign(experiments, "u1").variant
        other = next(v for v in ("control", "treatment", "bogus-arm") if v != arm)
        body = {"event_id": "ev-arm", "user_id": "u1", "item_id": "m4", "type": "click"}
        refused = client.post("/v1/events", json={**body, "variant": other})
        assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "variant"]
        assert refused.json()["detail"][0]["msg"] == (f"variant {other!r} is not the arm of user 'u1' in experiment "
                                                      f"'exp-1' ({arm!r}); send that one, or none")
        assert ids(client)[0][0] == "m4"  # nothing recorded: m4 is still recommended
        assert client.post("/v1/events", json={**body, "variant": arm}).json()["status"] == "accepted"
        assert client.post("/v1/events", json={**body, "event_id": "ev-arm-2"}).json()["status"] == "accepted"
