"""``recsys demo``'s LLM pieces on toy-size real objects: the LLM switched on, the budget cut.

The cut-budget request runs a real ``LLMRerankStage`` (a tiny random Llama of SmolLM2's
architecture) between the toy popularity recall and audience rules, through the server's
own ``Recommender``: with its budget cut the LLM stage falls back and the answer is the
light path's order, marked ``fallback``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from cascade.registry import build_stage
from cascade.settings import Settings
from cli.demo import DEMO_RECALL_MAX_LOGITS, cut_llm_budget, demo_recall_budget, llm_enabled, with_debug_key
from llm_rerank.stage import LLMRerankStage
from recsys.config import StageSpec
from recsys.pipeline import Pipeline
from serving.app import create_app
from serving.catalog_state import CatalogState
from serving.schemas import RecommendRequest
from serving.service import Recommender
from tests.llm_rerank.factories import save_tiny_llm
from tests.serving.conftest import toy_pipeline
from tests.serving.toy import AudienceRules, PopularityRecall, save_toy_split, toy_settings

RECALL = StageSpec(name="recall", kind="recall", on_error="fail")
LLM = StageSpec(name="llm", kind="llm", on_error="passthrough", budget_ms=30_000)
RULES = StageSpec(name="rules", kind="rules", on_error="fail")


def test_the_demo_bounds_two_tower_fits_by_logits_not_by_the_clock() -> None:
    settings = Settings.from_yaml(None)
    demo = demo_recall_budget(settings)
    assert demo.recall.max_train_logits == DEMO_RECALL_MAX_LOGITS and settings.recall.max_train_logits is None
    assert demo.recall.max_train_s == settings.recall.max_train_s  # the clock stays a safety net only
    assert demo.recall.model_copy(update={"max_train_logits": None}) == settings.recall.model_copy(
        update={"max_train_logits": None})  # nothing else changes
    smaller = settings.model_copy(update={"recall": settings.recall.model_copy(update={"max_train_logits": 1e6})})
    assert demo_recall_budget(smaller).recall.max_train_logits == 1e6
    unbounded = settings.model_copy(update={"recall": settings.recall.model_copy(update={"max_train_logits": None})})
    assert demo_recall_budget(unbounded).recall.max_train_logits == DEMO_RECALL_MAX_LOGITS


def test_llm_enabled_switches_on_the_llm_stage_only() -> None:
    settings = Settings.from_yaml(None)  # configs/pipeline.yaml: the LLM stage is there, disabled
    assert not next(s for s in settings.pipeline.stages if s.kind == "llm").enabled
    on = llm_enabled(settings)
    assert [(s.name, s.enabled) for s in on.pipeline.stages] == [
        (s.name, True if s.kind == "llm" else s.enabled) for s in settings.pipeline.stages]
    assert on.serving.llm_share == settings.serving.llm_share  # requests still opt in one by one
    with pytest.raises(ValueError, match="no stage of kind 'llm'"):
        llm_enabled(toy_settings())


def test_cut_budget_serves_the_previous_order_marked_fallback(tmp_path: Path) -> None:
    save_toy_split(tmp_path / "toy")
    model_dir = save_tiny_llm(tmp_path / "tiny-llm")
    settings = toy_settings(RECALL, LLM, RULES).model_copy(update={"llm": Settings.build({"llm": {
        "model": str(model_dir), "precision": "fp32", "candidates": 5}}).llm})
    stages = []
    for spec, cls in ((RECALL, PopularityRecall), (LLM, LLMRerankStage), (RULES, AudienceRules)):
        stage = build_stage(spec, settings, cls=cls)
        stage.load(tmp_path / "toy")
        stages.append((spec, stage))
    rec = Recommender(settings, CatalogState.load(tmp_path / "toy"),
                      Pipeline(stages, request_budget_ms=settings.pipeline.request_budget_ms))

    def ask(r: Recommender, llm: bool) -> dict:
        return r.recommend(RecommendRequest(user_id="u3", k=3, llm=llm))

    full, light = ask(rec, True), ask(rec, False)
    cut = ask(cut_llm_budget(rec, settings), True)
    assert full["path"] == "llm" and light["path"] == "light"
    assert cut["path"] == "fallback" and cut["fallbacks"] == ["llm"]
    trace = next(s for s in cut["stages"] if s["name"] == "llm")
    assert trace["status"] == "fallback" and trace["reason"]
    assert [i["id"] for i in cut["items"]] == [i["id"] for i in light["items"]]  # the order before the LLM
    assert next(s for s in full["stages"] if s["name"] == "llm")["status"] == "ok"  # the loaded stage is shared


def test_the_demo_server_answers_its_debug_requests_and_nobody_else(tmp_path: Path) -> None:
    """The demo shows the LLM's own order from a debug answer, which the server gives only to a key:
    without one configured the demo's server gets a one-off key, and the demo sends it."""
    save_toy_split(tmp_path)
    settings, key = with_debug_key(toy_settings(RECALL, RULES))
    assert len(key) >= 24 and with_debug_key(settings)[1] == key  # a configured key is kept, not replaced
    app = create_app(settings, tmp_path, pipeline=toy_pipeline(tmp_path, settings, [(RECALL, PopularityRecall),
                                                                                    (RULES, AudienceRules)]))
    body = {"user_id": "u1", "k": 3, "debug": True}
    with TestClient(app) as client:
        assert client.post("/v1/recommend", json=body, headers={"X-API-Key": key}).status_code == 200
        assert client.post("/v1/recommend", json=body).status_code == 403
    admin = toy_settings(RECALL, RULES).model_copy(update={"serving": toy_settings(RECALL, RULES).serving.model_copy(
        update={"admin_api_key": SecretStr("an-admin-key-of-enough-length")})})
    assert with_debug_key(admin) == (admin, "an-admin-key-of-enough-length")
