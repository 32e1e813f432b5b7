"""``explain: true`` on POST /v1/recommend: reasons on the top explain_k items, their source, the
budget, the Redis reason cache and the prompt version, through the real app on the toy catalog
with the real LLM stage over a tiny random model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from cascade.settings import Settings
from llm_rerank.stage import LLMRerankStage
from recsys.config import StageSpec
from serving.app import create_app
from tests.llm_rerank.factories import save_tiny_llm
from tests.serving.conftest import ADMIN_KEY, toy_pipeline
from tests.serving.toy import AudienceRules, PopularityRecall

RECALL = StageSpec(name="recall", kind="recall", on_error="fail")
LLM = StageSpec(name="llm", kind="llm", depth=20)
RULES = StageSpec(name="rules", kind="rules", on_error="fail")
ADMIN = {"X-API-Key": ADMIN_KEY}


@pytest.fixture(scope="module")
def tiny_llm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llm(tmp_path_factory.mktemp("llm") / "tiny-llm")


def explain_client(artifact_dir: Path, llm_dir: Path | None, **explain: Any) -> TestClient:
    """The toy app; with ``llm_dir`` the pipeline's LLM stage runs that model and writes the reasons."""
    pairs: list[tuple[StageSpec, type]] = [(RECALL, PopularityRecall), (RULES, AudienceRules)]
    if llm_dir is not None:
        pairs.insert(1, (LLM, LLMRerankStage))
    settings = Settings.build({
        "pipeline": {"max_k": 5, "stages": [s.model_dump() for s, _ in pairs]},
        "serving": {"admin_api_key": ADMIN_KEY, "versions_poll_s": 0.1, "explain_needs_key": False},
        "llm": {"model": str(llm_dir or "unused"), "precision": "fp32", "candidates": 5,
                "explain": {"model": "pipeline", **explain}}})
    return TestClient(create_app(settings, artifact_dir, pipeline=toy_pipeline(artifact_dir, settings, pairs)))


@pytest.fixture
def templates_only(toy_dir: Path) -> Iterator[TestClient]:
    with explain_client(toy_dir, None) as c:
        yield c


@pytest.fixture
def with_llm(toy_dir: Path, tiny_llm_dir: Path) -> Iterator[TestClient]:
    with explain_client(toy_dir, tiny_llm_dir, budget_ms=60_000) as c:
        yield c


def test_explain_gives_the_top_explain_k_items_a_reason(templates_only: TestClient) -> None:
    body = templates_only.post("/v1/recommend", json={"user_id": "u1", "k": 3, "explain": True,
                                                      "explain_k": 2}).json()
    reasons = [(i.get("reason"), i.get("reason_source")) for i in body["items"]]
    # u1 had Alpha, Bravo, Charlie; no model here, so the templates speak, with the generic catalog's verb
    assert reasons[:2] == [("Picked from what you bought recently, such as Charlie.", "template")] * 2
    assert "reason" not in body["items"][2]


def test_explain_k_defaults_to_three_and_stops_at_the_list(templates_only: TestClient) -> None:
    items = templates_only.post("/v1/recommend", json={"user_id": "u1", "k": 5, "explain": True}).json()["items"]
    assert [("reason" in i) for i in items] == [True, True, True, False, False][: len(items)]
    items = templates_only.post("/v1/recommend", json={"user_id": "u3", "k": 1, "explain": True,
                                                       "explain_k": 4}).json()["items"]
    assert len(items) == 1 and items[0]["reason_source"] == "template"


def test_a_request_without_explain_carries_no_reason(templates_only: TestClient) -> None:
    items = templates_only.post("/v1/recommend", json={"user_id": "u1", "k": 3}).json()["items"]
    assert all("reason" not in i and "reason_source" not in i for i in items)


@pytest.mark.parametrize("explain_k", [0, 21, "3"])
def test_a_bad_explain_k_is_a_422_naming_it(templates_only: TestClient, explain_k: Any) -> None:
    resp = templates_only.post("/v1/recommend", json={"user_id": "u1", "explain": True, "explain_k": explain_k})
    assert resp.status_code == 422
    assert resp.json()["detail"][0]["loc"][-1] == "explain_k"


def test_a_cold_user_is_told_what_is_popular(templates_only: TestClient) -> None:
    items = templates_only.post("/v1/recommend", json={"user_id": "nobody", "k": 2, "explain": True}).json()["items"]
    assert [i["reason"] for i in items] == ["Popular with new visitors."] * 2


def test_the_llm_stage_writes_checked_reasons_and_caches_them_in_redis(with_llm: TestClient, redis_env: str,
                                                                       toy_dir: Path) -> None:
    ask = {"user_id": "u1", "k": 2, "explain": True, "llm": True}
    first = with_llm.post("/v1/recommend", json=ask).json()
    assert [i["reason_source"] in ("llm", "template") for i in first["items"]] == [True, True]
    assert all(i["reason"] for i in first["items"])
    keys = redis.Redis.from_url(redis_env).keys(f"{toy_dir.name}:reason:*")
    assert len(keys) == 2
    second = with_llm.post("/v1/recommend", json=ask).json()
    assert [(i["reason"], i["reason_source"]) for i in second["items"]] == [
        (i["reason"], i["reason_source"]) for i in first["items"]]


def test_a_published_prompt_gets_new_reasons(with_llm: TestClient, redis_env: str, toy_dir: Path) -> None:
    ask = {"user_id": "u1", "k": 1, "explain": True, "llm": True}
    with_llm.post("/v1/recommend", json=ask)
    client = redis.Redis.from_url(redis_env)
    assert len(client.keys(f"{toy_dir.name}:reason:*")) == 1
    resp = with_llm.put("/admin/prompts", headers=ADMIN,
                        json={"version": "why-2", "explain_request": "Say briefly why this {domain} fits."})
    assert resp.status_code in (200, 201), resp.text
    with_llm.post("/v1/recommend", json=ask)
    assert len(client.keys(f"{toy_dir.name}:reason:*")) == 2  # written again under the new prompt version


def test_a_budget_of_zero_serves_templates_at_once(toy_dir: Path, tiny_llm_dir: Path) -> None:
    with explain_client(toy_dir, tiny_llm_dir, budget_ms=0) as c:
        items = c.post("/v1/recommend", json={"user_id": "u1", "k": 2, "explain": True, "llm": True}).json()["items"]
    assert [i["reason_source"] for i in items] == ["template", "template"]


def test_the_backbone_loaded_for_reasons_alone_serves_the_published_prompt(toy_dir: Path, tiny_llm_dir: Path,
                                                                           redis_env: str) -> None:
    """No LLM stage in the pipeline: the configured backbone is loaded for reasons on the first explain
    request (templates meanwhile), and a prompt published afterwards reaches it."""
    settings = Settings.build({
        "pipeline": {"max_k": 5, "stages": [RECALL.model_dump(), RULES.model_dump()]},
        "serving": {"admin_api_key": ADMIN_KEY, "versions_poll_s": 0.1, "explain_needs_key": False},
        "llm": {"model": str(tiny_llm_dir), "precision": "fp32", "explain": {"budget_ms": 60_000}}})
    pairs: list[tuple[StageSpec, type]] = [(RECALL, PopularityRecall), (RULES, AudienceRules)]
    with TestClient(create_app(settings, toy_dir, pipeline=toy_pipeline(toy_dir, settings, pairs))) as c:
        ask = {"user_id": "u1", "k": 2, "explain": True}
        assert c.post("/v1/recommend", json=ask).status_code == 200
        explanations = c.app.state.slot.recommender.explanations  # type: ignore[attr-defined]
        explanations.start_loading(wait=True)
        assert explanations.backbone() == str(tiny_llm_dir)
        resp = c.put("/admin/prompts", headers=ADMIN, json={"version": "why-3", "explain_request": "Why this {domain}?"})
        assert resp.status_code in (200, 201), resp.text
        assert explanations.generator().stage.template.explain_request == "Why this {domain}?"
        c.post("/v1/recommend", json=ask)
        assert len(redis.Redis.from_url(redis_env).keys(f"{toy_dir.name}:reason:*")) == 2


def test_an_explain_request_is_never_answered_from_the_result_cache(templates_only: TestClient) -> None:
    plain = templates_only.post("/v1/recommend", json={"user_id": "u1", "k": 2}).json()
    again = templates_only.post("/v1/recommend", json={"user_id": "u1", "k": 2}).json()
    assert plain["path"] != "cache" and again["path"] == "cache"
    explained = templates_only.post("/v1/recommend", json={"user_id": "u1", "k": 2, "explain": True}).json()
    assert explained["path"] != "cache"
    assert all(i["reason"] for i in explained["items"])
    later = templates_only.post("/v1/recommend", json={"user_id": "u1", "k": 2}).json()
    assert all("reason" not in i for i in later["items"])  # nor is a plain one answered with reasons


def test_explanations_need_a_key_by_default_since_reasons_name_the_users_history(toy_dir: Path) -> None:
    """Anyone could read any known user's history from the reasons of an unauthenticated explain request."""
    settings = Settings.build({"pipeline": {"max_k": 5, "stages": [RECALL.model_dump(), RULES.model_dump()]},
                               "serving": {"admin_api_key": ADMIN_KEY}})
    pairs = [(RECALL, PopularityRecall), (RULES, AudienceRules)]
    with TestClient(create_app(settings, toy_dir, pipeline=toy_pipeline(toy_dir, settings, pairs))) as client:
        ask = {"user_id": "u1", "k": 2, "explain": True}
        refused = client.post("/v1/recommend", json=ask)
        assert refused.status_code == 403 and "reasons name items of the user's history" in refused.json()["detail"]
        assert client.post("/v1/recommend", json=ask, headers=ADMIN).status_code == 200
        assert client.post("/v1/recommend", json={**ask, "explain": False}).status_code == 200
