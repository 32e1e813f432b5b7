"""A worker's online backend gives a served recommender everything it needs before it exists.

``Recommender.build`` asks ``OnlineBackend.link`` for the online state and the version provider,
so the first answer of a new (or reloaded) recommender already uses the active rule set and
reports the active prompt version; nothing is wired into a built recommender afterwards.
"""

from __future__ import annotations

from pathlib import Path

from cascade.registry import build_pipeline
from recsys.config import StageSpec
from rules.stage import RulesStage
from serving.catalog_state import CatalogState
from serving.document_reload import document_json
from serving.online_backend import OnlineBackend
from serving.schemas import RecommendRequest
from serving.service import Recommender
from tests.serving.conftest import RULES, toy_pipeline
from tests.serving.toy import DEFAULT_GATES, PopularityRecall, toy_settings

BLOCK_M4 = {"version": "block-m4", "rules": [{"id": "no_m4", "kind": "blocklist", "items": {"item_ids": ["m4"]}}],
            "acknowledge_dropped_gates": DEFAULT_GATES}
PROMPT = {"version": "p-7", "system": "Rank films for this user."}


def test_a_served_recommender_is_built_on_the_online_state_with_the_active_versions(toy_dir: Path) -> None:
    settings = toy_settings()
    backend = OnlineBackend.open(settings, toy_dir)
    try:
        backend.versions.publish("rules", "block-m4", document_json(BLOCK_M4))  # another worker's PUT
        backend.versions.publish("prompts", "p-7", document_json(PROMPT))
        pipe = toy_pipeline(toy_dir, settings, [(settings.pipeline.stages[0], PopularityRecall), (RULES, RulesStage)])
        rec = Recommender.build(settings, CatalogState.load(toy_dir), pipe, None, toy_dir, backend)
        assert rec.online is backend.online and rec.online is not None
        assert rec.versions()["rules"] == "block-m4" and rec.versions()["prompt"] == "p-7"
        answer = rec.respond(RecommendRequest(user_id="u1", k=5), log_impressions=False)
        assert "m4" not in [item.id for item in answer.items] and not answer.degraded

        first_watcher = backend.watcher
        again = toy_pipeline(toy_dir, settings, [(settings.pipeline.stages[0], PopularityRecall), (RULES, RulesStage)])
        reloaded = Recommender.build(settings, CatalogState.load(toy_dir), again, rec.metrics, toy_dir, backend)
        assert backend.watcher is not first_watcher  # the previous pipeline's watcher stopped, not shared
        assert reloaded.online is backend.online and reloaded.online is not rec.online
        assert reloaded.versions()["rules"] == "block-m4" == again.stage("rules").version()
    finally:
        backend.close()


def test_the_served_llm_stage_shares_the_workers_redis_client(toy_dir: Path) -> None:
    settings = toy_settings(StageSpec(name="recall", kind="recall", on_error="fail"), StageSpec(name="llm", kind="llm"))
    settings = settings.model_copy(update={"llm": settings.llm.model_copy(
        update={"kv": settings.llm.kv.model_copy(update={"tier2": True})})})
    backend = OnlineBackend.open(settings, toy_dir)
    try:
        pipeline = build_pipeline(settings, toy_dir, load=False, redis=backend.client)
        assert pipeline.stage("llm").redis is backend.client  # type: ignore[attr-defined]
    finally:
        backend.close()
