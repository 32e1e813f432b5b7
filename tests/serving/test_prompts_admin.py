"""``PUT /admin/prompts`` over HTTP with the real LLM stage on a tiny random model.

A prompt version stored and reported in ``versions.prompt`` must also be what the stage applies
(``test_online_app.test_prompt_versions_are_stored_and_reported`` checks only the report).
Here the token ids the LLM stage's model receives are decoded before and after the PUT.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from llm_rerank.stage import LLMRerankStage
from llm_rerank.template import parse_prompt_document
from recsys.config import StageSpec
from recsys.pipeline import Pipeline
from rules.stage import RulesStage
from serving.app import create_app
from tests.llm_rerank.factories import save_tiny_llm, smollm2_tokenizer
from tests.serving.conftest import ADMIN_KEY, RECALL, RULES, toy_pipeline
from tests.serving.toy import PopularityRecall, toy_settings

AUTH = {"X-API-Key": ADMIN_KEY}
CRITICS = "version: critics-1\nsystem: You pick {domain}s for film critics.\n"


@pytest.fixture
def llm_app(toy_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Pipeline]]:
    model = save_tiny_llm(tmp_path_factory.mktemp("tiny-llm"))
    llm = StageSpec(name="llm", kind="llm", budget_ms=60_000,
                    # the whole-prefix LRU, whose entries hold the instruction: the block cache keys blocks
                    # by token ids, so an old instruction's KV is unreachable by construction
                    # the toy catalog records no layout, so its word for an item is set: the tests read the film prompts
                    params={"model": str(model), "precision": "fp32", "candidates": 5, "kv": {"enabled": False},
                            "domain": "movie"})
    pairs = [(RECALL, PopularityRecall), (llm, LLMRerankStage), (RULES, RulesStage)]
    settings = toy_settings(*(spec for spec, _ in pairs), admin_api_key=ADMIN_KEY, versions_poll_s=0.1)
    pipeline = toy_pipeline(toy_dir, settings, pairs)
    with TestClient(create_app(settings, toy_dir, pipeline=pipeline)) as client:
        yield client, pipeline


def llm_answer(client: TestClient, stage: LLMRerankStage, user: str = "u1") -> tuple[dict, str]:
    """One LLM-path answer for ``user`` and the text of the token ids the stage's model embedded for it."""
    seen: list[list[int]] = []
    hook = stage.local().model.get_input_embeddings().register_forward_pre_hook(lambda _m, a: seen.extend(a[0].tolist()))
    try:
        data = client.post("/v1/recommend", json={"user_id": user, "k": 3, "llm": True}).json()
    finally:
        hook.remove()
    assert data["path"] == "llm", data
    return data, "\n".join(smollm2_tokenizer().decode(row) for row in seen)


def test_put_prompt_changes_what_the_llm_stage_sees(llm_app: tuple[TestClient, Pipeline]) -> None:
    client, pipeline = llm_app
    stage = pipeline.stage("llm")
    before, seen = llm_answer(client, stage)
    assert "You recommend movies. Titles appear between « and »" in seen and "critics" not in seen
    assert "prompt" not in before["versions"] and before["versions"]["llm"].endswith("-p1-listwise")

    put = client.put("/admin/prompts", content=CRITICS, headers=AUTH)
    assert put.status_code == 200 and put.json()["active"] == "critics-1"
    after, seen = llm_answer(client, stage)  # a new prompt version: not the cached answer
    assert "You pick movies for film critics. Titles appear between « and »" in seen
    assert "You recommend movies" not in seen
    digest = parse_prompt_document({"system": "You pick {domain}s for film critics."}).digest()
    assert after["versions"]["prompt"] == "critics-1"
    assert after["versions"]["llm"].endswith(f"-p1.{digest}-listwise")

    published = {"version": "default-text", "system": "You recommend {domain}s."}
    assert client.put("/admin/prompts", json=published, headers=AUTH).status_code == 200
    _, seen = llm_answer(client, stage, "u2")
    assert "You recommend movies." in seen
    assert client.post("/admin/prompts/rollback", json={"version": "critics-1"}, headers=AUTH).status_code == 200
    _, seen = llm_answer(client, stage, "u3")  # u1's answer under critics-1 is cached: another user
    assert "You pick movies for film critics." in seen


@pytest.mark.parametrize(("document", "key", "message"), [
    ("version: bad-1\nsytem: You rank.\n", "sytem", "unknown key"),
    ("version: bad-2\nsystem: Rank {genre}s.\n", "system", "unknown placeholder {genre}"),
    ("version: bad-3\nlistwise_question: \"<|im_start|>assistant\"\n", "listwise_question", "chat special token"),
    ("version: 1.10\nsystem: You rank.\n", "version", "must be a string"),
])
def test_invalid_prompt_document_is_a_422_naming_the_key(llm_app: tuple[TestClient, Pipeline], document: str,
                                                           key: str, message: str) -> None:
    client, pipeline = llm_app
    assert client.put("/admin/prompts", content=CRITICS, headers=AUTH).status_code == 200
    resp = client.put("/admin/prompts", content=document, headers=AUTH)
    assert resp.status_code == 422
    assert f"'{key}'" in resp.json()["detail"] and message in resp.json()["detail"]
    versions = client.get("/admin/prompts/versions", headers=AUTH).json()
    assert (versions["active"], versions["serving"]) == ("critics-1", "critics-1")  # nothing stored
    _, seen = llm_answer(client, pipeline.stage("llm"))
    assert "You pick movies for film critics." in seen  # the valid version keeps serving
