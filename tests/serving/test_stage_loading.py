"""A configured LLM stage that fails to load: the cause is logged, /readyz and /metrics show it.

Without that, the failure would be visible only as a log line, with ``/readyz`` saying ready and
no trace of the lost stage while every request silently takes the light path.
``MissingArtifactsLLM`` (tests/serving/toy.py) raises ``FileNotFoundError`` from ``load``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from cascade.registry import STAGE_KINDS
from recsys.config import StageSpec
from serving.app import create_app
from serving.stage_loading import DegradedStage, UnloadedStage, degraded_stages, load_pipeline
from tests.serving.conftest import RECALL, RULES
from tests.serving.toy import MissingArtifactsLLM, toy_settings

LLM = StageSpec(name="llm", kind="llm")


@pytest.fixture
def missing_llm(toy_kinds: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(STAGE_KINDS, "llm", MissingArtifactsLLM)


def _ready(client: TestClient) -> dict:
    deadline = time.monotonic() + 20
    while (resp := client.get("/readyz")).status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_failed_llm_load_is_logged_with_its_cause_and_kept_as_unloaded(
    toy_dir: Path, missing_llm: None, caplog: pytest.LogCaptureFixture
) -> None:
    settings = toy_settings(RECALL, LLM, RULES)
    with caplog.at_level(logging.ERROR, logger="serving.stage_loading"):
        pipeline = load_pipeline(settings, toy_dir)
    [record] = [r for r in caplog.records if r.name == "serving.stage_loading"]
    assert f"FileNotFoundError: {toy_dir}/llm: no adapter here" in record.getMessage()
    assert record.levelno == logging.ERROR and record.exc_info is not None  # the traceback travels with it
    spec, stage = pipeline.stages[1]
    assert spec.enabled is False and isinstance(stage, UnloadedStage)
    assert degraded_stages(settings, pipeline) == [
        DegradedStage("llm", "llm", f"FileNotFoundError: {toy_dir}/llm: no adapter here")]


def test_stage_disabled_in_config_is_not_degraded(toy_dir: Path, missing_llm: None) -> None:
    settings = toy_settings(RECALL, LLM.model_copy(update={"enabled": False}), RULES)
    assert degraded_stages(settings, load_pipeline(settings, toy_dir)) == []


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "background-load"])
def test_readyz_and_metrics_name_the_llm_stage_that_failed_to_load(toy_dir: Path, missing_llm: None,
                                                                   eager: bool) -> None:
    settings = toy_settings(RECALL, LLM, RULES, llm_share=1.0)
    pipeline = load_pipeline(settings, toy_dir) if eager else None  # background: what `recsys serve` does
    with TestClient(create_app(settings, toy_dir, pipeline=pipeline)) as client:
        ready = _ready(client)
        answer = client.post("/v1/recommend", json={"user_id": "u1", "k": 3}).json()
        metrics = client.get("/metrics").text
    # still ready (it answers on the light path) but says what it runs without, and why
    assert ready["status"] == "ready"
    assert ready["degraded_stages"] == [
        {"stage": "llm", "kind": "llm", "reason": f"FileNotFoundError: {toy_dir}/llm: no adapter here"}]
    assert 'recsys_stage_load_failures_total{stage="llm"} 1.0' in metrics
    assert (answer["path"], answer["route"]) == ("light", "llm_unavailable")


def test_readyz_lists_no_degraded_stage_when_all_load(client: TestClient) -> None:
    ready = client.get("/readyz").json()
    assert ready["degraded_stages"] == []
    assert "recsys_stage_load_failures_total{" not in client.get("/metrics").text


def test_a_split_prepared_again_after_training_is_refused_at_start_up(toy_dir: Path, toy_kinds: None) -> None:
    # `recsys prepare` on new data without `recsys train`: the old models used to be served with the
    # new catalog, exit 0, no warning (the item indices point at other items)
    import json

    from cascade.registry import StaleArtifacts
    from offline.split import split_id

    settings = toy_settings(RECALL, RULES)
    (toy_dir / "recall").mkdir()
    (toy_dir / "recall" / "stage.json").write_text(json.dumps({"split_id": split_id(toy_dir)}))
    load_pipeline(settings, toy_dir)
    (toy_dir / "split" / "source.json").write_text('{"data": "another"}')  # what a new prepare writes
    with pytest.raises(StaleArtifacts, match=r"\['recall'\] were trained on another split"):
        load_pipeline(settings, toy_dir)
