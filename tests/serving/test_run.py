from __future__ import annotations

import socket
import time
from pathlib import Path

import numpy as np
import pytest
import uvicorn
from fastapi.testclient import TestClient

from cascade.registry import STAGE_KINDS
from recsys.contract import Candidates, StageTrace
from recsys.pipeline import PipelineError, PipelineResult
from serving.app import create_app
from serving.catalog_state import CatalogState
from serving.response import Served, answer_path, build_response
from serving.run import (
    APP_FACTORY,
    ENV_ARTIFACT_DIR,
    bind_listener,
    recommend_once,
    server_env,
    settings_from_env,
)
from serving.schemas import LimitError, RecommendResponse
from serving.server_process import free_port
from tests.serving.conftest import DEBUG, DEBUG_KEY, RECALL
from tests.serving.toy import FailingStage, toy_settings


def test_recommend_once_matches_the_http_answer(toy_dir: Path, toy_kinds: None) -> None:
    settings = toy_settings(debug_api_key=DEBUG_KEY)
    once = recommend_once(settings, toy_dir, "stranger", k=3, debug=True)
    RecommendResponse.model_validate(once)
    with TestClient(create_app(settings, toy_dir)) as client:
        while client.get("/readyz").status_code != 200:
            time.sleep(0.02)
        http = client.post("/v1/recommend", json={"user_id": "stranger", "k": 3, "debug": True}, headers=DEBUG).json()
    for volatile in ("request_id", "total_ms", "stages"):
        once.pop(volatile), http.pop(volatile)
    assert once == http
    assert [i["id"] for i in once["items"]] == ["m1", "m2", "m5"]


def test_recommend_once_refuses_bad_input_by_field(toy_dir: Path, toy_kinds: None) -> None:
    with pytest.raises(LimitError, match="k: Input should be less than or equal to 5"):
        recommend_once(toy_settings(), toy_dir, "u1", k=6)
    with pytest.raises(ValueError, match="user_id"):
        recommend_once(toy_settings(), toy_dir, "", k=3)


def test_recommend_once_raises_pipeline_error_of_fail_closed_stage(
    toy_dir: Path, toy_kinds: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(STAGE_KINDS, "rules", FailingStage)
    with pytest.raises(PipelineError, match="'rules'"):
        recommend_once(toy_settings(), toy_dir, "u1", k=3)


def test_omitted_k_shrinks_to_max_k(toy_dir: Path, toy_kinds: None) -> None:
    data = recommend_once(toy_settings(max_k=2), toy_dir, "stranger")  # k defaults to 10
    assert [i["id"] for i in data["items"]] == ["m1", "m2"]


@pytest.mark.parametrize(
    ("statuses", "path"),
    [
        ({"recall": "ok", "llm": "ok", "coarse": "fallback"}, "llm"),
        ({"recall": "ok", "llm": "skipped", "coarse": "fallback"}, "fallback"),
        ({"recall": "ok", "llm": "fallback"}, "fallback"),
        ({"recall": "ok", "llm": "skipped", "rules": "ok"}, "light"),
    ],
)
def test_answer_path(statuses: dict[str, str], path: str) -> None:
    traces = [StageTrace(name, status, 1.0, 0, 0) for name, status in statuses.items()]  # type: ignore[arg-type]
    assert answer_path(traces, frozenset({"llm"})) == path


def test_unscored_items_get_null_scores(toy_dir: Path) -> None:
    catalog = CatalogState.load(toy_dir)
    cands = Candidates(items=np.array([2, 0]), scores={"recall": np.array([1.0, np.nan], dtype=np.float32)},
                       order_by="recall")
    result = PipelineResult(cands, [StageTrace("recall", "ok", 0.5, 0, 2)], {"recall": "v"})
    answer = build_response(catalog.request_for("u1", 2, debug=True), result, catalog, frozenset(),
                            Served("not_in_share"), time.perf_counter())
    out = answer.as_json()
    assert [(i["id"], i["score"]) for i in out["items"]] == [("m3", 1.0), ("m1", None)]
    assert out["debug"]["item_scores"] == {"m3": {"recall": 1.0}, "m1": {"recall": None}}
    assert out["debug"]["history_len"] == 3


def test_settings_travel_to_workers_through_env(toy_dir: Path) -> None:
    settings = toy_settings(RECALL, max_k=7, max_body_bytes=2048)
    env = server_env(settings, toy_dir)
    assert env[ENV_ARTIFACT_DIR] == str(toy_dir.resolve())
    back = settings_from_env(env)
    assert back == settings
    assert (back.pipeline.max_k, back.serving.max_body_bytes) == (7, 2048)


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_stop_signal_under_serve_unwinds_so_the_embedded_redis_is_stopped(name: str) -> None:
    """Outside the HTTP server's own handling, the default actions killed the process before
    ``shared_state`` could stop the embedded redis-server, orphaning it on every ``kill``."""
    import signal

    from serving.run import exit_on_signals

    sig = getattr(signal, name)
    before = signal.getsignal(sig)
    cleaned = []
    with pytest.raises(SystemExit) as exited, exit_on_signals():
        try:
            signal.raise_signal(sig)
        finally:
            cleaned.append(True)
    assert exited.value.code == 128 + sig and cleaned == [True]
    assert signal.getsignal(sig) is before  # restored once serve returns


def test_the_listener_of_several_workers_sends_without_nagle_delay() -> None:
    # uvicorn binds it without a protocol number, so asyncio leaves TCP_NODELAY off on its connections: an
    # answer written as headers then body waited ~40 ms for the client's delayed ACK
    config = uvicorn.Config(APP_FACTORY, factory=True, host="127.0.0.1", port=free_port(), workers=2)
    with bind_listener(config) as listener:
        assert listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        listener.listen()
        with socket.create_connection(listener.getsockname()), listener.accept()[0] as accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)  # what each request's socket inherits
