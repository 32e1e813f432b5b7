"""Right by default over HTTP: short lists say so, and rule sets the catalog cannot satisfy are refused."""

from __future__ import annotations

from fastapi.testclient import TestClient

from serving.schemas import RecommendResponse
from tests.serving.conftest import ADMIN_KEY, DEBUG, DEBUG_KEY
from tests.serving.toy import DEFAULT_GATES


def test_a_list_the_rules_leave_short_says_complete_false_and_why(online: TestClient) -> None:
    resp = online.post("/v1/recommend", json={"user_id": "u2", "k": 5})
    assert resp.status_code == 200
    data = resp.json()
    RecommendResponse.model_validate(data)
    # u2 (15, no risk tolerance -> 1) has seen m1, m2, m4, m5; m3 is too risky: only m6 is left
    assert [i["id"] for i in data["items"]] == ["m6"]
    assert data["complete"] is False and data["short_by"] == 4
    assert data["short_reason"] == "no more candidates pass the rules"
    assert data["stages"][-1]["name"] == "backfill"


def test_a_full_list_is_complete(online: TestClient) -> None:
    data = online.post("/v1/recommend", json={"user_id": "u1", "k": 2}).json()
    assert len(data["items"]) == 2
    assert (data["complete"], data["short_by"], data["short_reason"]) == (True, 0, None)
    assert not any(i["backfill"] for i in data["items"])


def test_publishing_a_rule_on_an_attribute_the_catalog_lacks_is_refused_by_name(online: TestClient) -> None:
    doc = "version: tags-1\nrules:\n  - {id: no_gambling, kind: blocklist, items: {tags: [gambling]}}\n"
    resp = online.put("/admin/rules", content=doc, headers={"X-API-Key": ADMIN_KEY})
    assert resp.status_code == 422
    assert "rule 'no_gambling' (rules[0]): no item carries tags" in resp.json()["detail"]
    versions = online.get("/admin/rules/versions", headers={"X-API-Key": ADMIN_KEY}).json()
    assert "tags-1" not in [v["version"] for v in versions["versions"]]  # nothing half-written
    ok = doc.replace("items: {tags: [gambling]}", "items: {tags: [gambling]}, on_absent_attribute: skip")
    ok += f"acknowledge_dropped_gates: {DEFAULT_GATES}\n"
    assert online.put("/admin/rules", content=ok.replace("tags-1", "tags-2"),
                      headers={"X-API-Key": ADMIN_KEY}).status_code == 200


def test_debug_lists_what_each_stage_handed_on_and_the_fusion_weights(toy_dir) -> None:
    from fusion.stage import FusionStage
    from recsys.config import StageSpec
    from rules.stage import RulesStage
    from tests.serving.conftest import RECALL, RULES, client_for
    from tests.serving.toy import PopularityRecall

    fusion = StageSpec(name="fusion", kind="fusion")
    with client_for(toy_dir, [(RECALL, PopularityRecall), (RULES, RulesStage), (fusion, FusionStage)],
                    debug_api_key=DEBUG_KEY) as c:
        data = c.post("/v1/recommend", json={"user_id": "stranger", "k": 2, "debug": True}, headers=DEBUG).json()
    RecommendResponse.model_validate(data)
    handoffs = {h["stage"]: h for h in data["debug"]["handoffs"]}
    assert list(handoffs) == ["recall", "rules", "fusion"]
    # recall handed on all six films by popularity; the default rules removed m4 (adult, unknown age) and
    # m3 (risk 2 > default tolerance 1); fusion had no tuned weights: recall, the most refined scored stage
    assert [i["id"] for i in handoffs["recall"]["items"]] == ["m1", "m2", "m4", "m5", "m3", "m6"]
    assert handoffs["recall"]["items"][0]["score"] == 3.0 and handoffs["recall"]["n"] == 6
    assert [i["id"] for i in handoffs["rules"]["items"]] == ["m1", "m2", "m5", "m6"]
    assert handoffs["fusion"]["fusion_weights"] == {"recall": 1.0}
    assert "fusion_weights" not in handoffs["recall"]  # only the fusion stage's hand-off carries them
    assert [i["id"] for i in data["items"]] == ["m1", "m2"]
