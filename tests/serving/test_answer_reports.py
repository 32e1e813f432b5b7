"""What an answer says about itself: why it took the light path, and the time a cache hit took."""

from __future__ import annotations

from fastapi.testclient import TestClient


def test_asking_for_the_llm_where_the_config_enables_none_says_it_is_disabled(client: TestClient) -> None:
    answer = client.post("/v1/recommend", json={"user_id": "u1", "k": 3, "llm": True}).json()
    assert (answer["path"], answer["route"]) == ("light", "llm_disabled")


def test_a_cache_hit_reports_its_own_timing_not_the_computed_answers(client: TestClient) -> None:
    body = {"user_id": "u2", "k": 3, "context": {"device": "tv"}}
    computed = client.post("/v1/recommend", json=body).json()
    hit = client.post("/v1/recommend", json=body).json()
    assert computed["path"] != "cache" and hit["path"] == "cache"
    assert hit["items"] == computed["items"]
    assert [s["name"] for s in hit["stages"]] == [s["name"] for s in computed["stages"]]
    for was, now in zip(computed["stages"], hit["stages"], strict=True):
        assert (now["status"], now["ms"]) == ("cached", 0.0)
        assert now["reason"].startswith(f"result cache: {was['status']} in {was['ms']} ms when computed")
