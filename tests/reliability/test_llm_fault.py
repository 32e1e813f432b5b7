"""The LLM backend hanging or crashing: the answer comes back in coarse order, flagged, within budget.

A real ``LLMRerankStage`` on the tiny random SmolLM2-architecture model, served over HTTP
behind a popularity "coarse" stage. Faults are injected into the model itself with a
forward pre-hook: one that blocks (a hung backend: the stage cannot check its deadline
while inside the forward pass, so only the pipeline's watchdog can answer in time) and one
that raises (a crashed backend).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from cascade.registry import stage_context
from cascade.settings import Settings
from llm_rerank.stage import LLMRerankStage
from recsys.config import StageSpec
from recsys.contract import Request
from recsys.pipeline import Pipeline
from recsys.watchdog import MAX_ABANDONED
from serving.app import create_app
from tests.llm_rerank.factories import PopularityStage, save_tiny_llm, tiny_split

REQUEST_BUDGET_MS = 2000.0
LLM_BUDGET_MS = 600.0
COARSE = StageSpec(name="recall", kind="recall", depth=50, on_error="fail")  # stands in for coarse
LLM = StageSpec(name="llm", kind="llm", depth=20, budget_ms=LLM_BUDGET_MS)


@pytest.fixture(scope="module")
def llm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("llm-fault")
    save_tiny_llm(root / "tiny-llm")
    tiny_split().save(root / "data" / "split")
    return root


@pytest.fixture
def served(llm_dir: Path) -> Iterator[tuple[TestClient, LLMRerankStage]]:
    settings = Settings.build({
        "artifacts_dir": str(llm_dir),
        "llm": {"model": str(llm_dir / "tiny-llm"), "precision": "fp32", "candidates": 8},
        "pipeline": {"max_k": 5, "request_budget_ms": REQUEST_BUDGET_MS,
                     "stages": [COARSE.model_dump(), LLM.model_dump()]},
        "serving": {"result_cache_ttl_s": 0},
    })
    llm = LLMRerankStage(LLM, settings.llm, **stage_context("llm", settings))
    llm.load(llm_dir / "data")
    llm.score(Request(user_id="u0", history=np.array([1, 2])), np.arange(8))  # warm: the first forward is slow
    pipeline = Pipeline([(COARSE, PopularityStage(tiny_split())), (LLM, llm)], REQUEST_BUDGET_MS)
    with TestClient(create_app(settings, llm_dir / "data", pipeline=pipeline)) as client:
        yield client, llm


def ask(client: TestClient, llm: bool) -> dict[str, Any]:
    resp = client.post("/v1/recommend", json={"user_id": "u0", "k": 5, "llm": llm})
    assert resp.status_code == 200, resp.text
    return resp.json()


def ids(answer: dict[str, Any]) -> list[str]:
    return [item["id"] for item in answer["items"]]


def assert_coarse_fallback(answer: dict[str, Any], coarse_order: list[str], reason: str) -> None:
    assert answer["path"] == "fallback" and answer["fallbacks"] == ["llm"]
    assert ids(answer) == coarse_order
    assert answer["stages"][-1]["status"] == "fallback" and reason in answer["stages"][-1]["reason"]


@pytest.mark.slow
def test_hung_llm_backend_falls_back_to_coarse_order_within_budget(served: tuple[TestClient, LLMRerankStage]) -> None:
    client, llm = served
    coarse_order = ids(ask(client, llm=False))
    assert ask(client, llm=True)["path"] == "llm"  # healthy first
    release = threading.Event()
    hook = llm.local().model.register_forward_pre_hook(lambda module, args: release.wait(30) and None)
    try:
        answer = ask(client, llm=True)
        assert_coarse_fallback(answer, coarse_order, "call abandoned")
        # answered while the forward pass is still blocked: the deadline ended the wait, not the backend
        assert llm_stuck(client)["llm"] == 1
        for n in range(2, MAX_ABANDONED + 1):  # each hung call holds a thread until the backend answers
            assert_coarse_fallback(ask(client, llm=True), coarse_order, "call abandoned")
            assert llm_stuck(client)["llm"] == n
        # with MAX_ABANDONED calls stuck the stage is not even tried: a fallback holding no further thread
        instant = ask(client, llm=True)
        assert_coarse_fallback(instant, coarse_order, f"{MAX_ABANDONED} earlier calls still running")
        assert llm_stuck(client)["llm"] == MAX_ABANDONED
    finally:
        release.set()
        hook.remove()
    stuck = llm_stuck(client)
    for _ in range(100):
        if stuck["llm"] == 0:
            break
        threading.Event().wait(0.05)
    assert stuck["llm"] == 0  # the released calls finished and gave their slots back
    assert ask(client, llm=True)["path"] == "llm"  # recovered without a restart


def test_crashing_llm_backend_falls_back_to_coarse_order(served: tuple[TestClient, LLMRerankStage]) -> None:
    client, llm = served
    coarse_order = ids(ask(client, llm=False))

    def crash(module: Any, args: Any) -> None:
        raise RuntimeError("backend crashed: device lost")

    hook = llm.local().model.register_forward_pre_hook(crash)
    try:
        answer = ask(client, llm=True)
    finally:
        hook.remove()
    assert_coarse_fallback(answer, coarse_order, "RuntimeError: backend crashed: device lost")
    assert ask(client, llm=True)["path"] == "llm"


def llm_stuck(client: TestClient) -> dict[str, int]:
    pipeline = client.app.state.slot.recommender.pipeline  # type: ignore[attr-defined]
    return pipeline.watchdog.stuck
