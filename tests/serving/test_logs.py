from __future__ import annotations

import io
import json
import logging
import logging.config

import pytest
from fastapi.testclient import TestClient

from serving.logs import JsonFormatter, log_config, request_id_var


def test_json_lines_carry_the_request_id_and_extras() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("test.json")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    token = request_id_var.set("rid-1")
    try:
        logger.info("served %d items", 3, extra={"path": "light"})
    finally:
        request_id_var.reset(token)
        logger.removeHandler(handler)
    line = json.loads(stream.getvalue())
    assert (line["msg"], line["request_id"], line["path"], line["level"]) == ("served 3 items", "rid-1", "light", "info")


def test_log_config_is_accepted_by_dictconfig() -> None:
    config = log_config("WARNING")
    assert config["formatters"]["json"]["()"] == "serving.logs.JsonFormatter"
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        logging.config.dictConfig(config)
        assert isinstance(root.handlers[0].formatter, JsonFormatter)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_access_log_records_each_request_with_its_id(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="serving.access"):
        client.post("/v1/recommend", json={"user_id": "u1", "k": 1}, headers={"X-Request-ID": "trace-9"})
        client.get("/healthz", headers={"X-Request-ID": "bad id with spaces"})
    recs = [r for r in caplog.records if r.name == "serving.access"]
    assert [(r.request_id, r.path, r.status) for r in recs[:1]] == [("trace-9", "/v1/recommend", 200)]  # type: ignore[attr-defined]
    assert len(recs[1].request_id) == 32  # type: ignore[attr-defined] # an unsafe header is replaced
    assert "key" not in json.loads(JsonFormatter().format(recs[0]))
