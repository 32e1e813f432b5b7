from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.exceptions import RequestValidationError
from fastapi.testclient import TestClient
from pydantic import ValidationError

from recsys.config import StageSpec
from recsys.contract import Candidates, Request
from serving.app import _validation_error, create_app
from serving.schemas import EventRequest, RecommendResponse
from tests.serving.conftest import ADMIN_KEY, DEBUG, DEBUG_KEY, RECALL, RULES, client_for
from tests.serving.toy import AudienceRules, FailingStage, PopularityRecall, YearRerank, toy_settings


def recommend(client: TestClient, **body: object):
    return client.post("/v1/recommend", json=body, headers=DEBUG if body.get("debug") else None)


def test_known_user_gets_k_items_with_every_field(client: TestClient) -> None:
    resp = recommend(client, user_id="u1", k=2)
    assert resp.status_code == 200
    data = resp.json()
    RecommendResponse.model_validate(data)  # the answer matches the documented schema
    # u1 has seen m1, m2, m3; popularity then ranks m4 (2), m5 (2), m6 (1); u1 is 30 so m4 stays
    assert [(i["id"], i["title"], i["score"], i["rank"]) for i in data["items"]] == [
        ("m4", "Delta", 2.0, 1), ("m5", "Echo", 2.0, 2)]
    assert data["user_id"] == "u1" and data["cold_start"] is False
    assert [(s["name"], s["status"], s["n_in"], s["n_out"]) for s in data["stages"]] == [
        ("recall", "ok", 0, 3), ("rules", "ok", 3, 3)]
    assert set(data["versions"]) == {"recall", "rules"} and data["versions"]["rules"] == "toy-rules-1"
    assert data["fallbacks"] == [] and data["path"] == "light"
    assert data["total_ms"] >= 0 and "debug" not in data
    assert resp.headers["X-Request-ID"] == data["request_id"] and len(data["request_id"]) == 32


def test_unknown_user_is_cold_start_and_rules_apply(client: TestClient) -> None:
    data = recommend(client, user_id="stranger", k=5).json()
    assert data["cold_start"] is True
    # popularity over everything; m4 is adult content and a stranger's age is unknown
    assert [i["id"] for i in data["items"]] == ["m1", "m2", "m5", "m3", "m6"]
    assert [i["disclaimers"] for i in data["items"]] == [[], [], [], ["risk level 2"], []]


def test_debug_adds_removed_items_and_stage_scores(client: TestClient) -> None:
    data = recommend(client, user_id="stranger", k=2, debug=True).json()
    RecommendResponse.model_validate(data)
    assert data["debug"]["removed"] == [{"id": "m4", "reason": "audience: adult"}]
    assert data["debug"]["item_scores"] == {"m1": {"recall": 3.0}, "m2": {"recall": 3.0}}
    assert data["debug"]["order_by"] == "recall" and data["debug"]["history_len"] == 0


def test_default_k_is_capped_by_catalog_and_request_id_header_is_echoed(client: TestClient) -> None:
    resp = client.post("/v1/recommend", json={"user_id": "u2"}, headers={"X-Request-ID": "abc-123"})
    data = resp.json()
    assert data["request_id"] == "abc-123"
    assert [(i["id"], i["disclaimers"]) for i in data["items"]] == [("m3", ["risk level 2"]), ("m6", [])]


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"user_id": "u1", "k": 0}, ["body", "k"]),
        ({"user_id": "u1", "k": 6}, ["body", "k"]),  # toy settings: pipeline.max_k = 5
        ({"user_id": "u1", "k": 2000}, ["body", "k"]),
        ({"user_id": "u1", "k": "3"}, ["body", "k"]),
        ({"user_id": "u1", "k": 2.5}, ["body", "k"]),
        ({"k": 3}, ["body", "user_id"]),
        ({"user_id": ""}, ["body", "user_id"]),
        ({"user_id": "x" * 513}, ["body", "user_id"]),
        ({"user_id": 7}, ["body", "user_id"]),
        ({"user_id": "u1", "debug": "yes"}, ["body", "debug"]),
        ({"user_id": "u1", "context": [1, 2]}, ["body", "context"]),
        ({"user_id": "u1", "context": {f"k{i}": i for i in range(40)}}, ["body", "context"]),
        ({"user_id": "u1", "context": {"note": "x" * 5000}}, ["body", "context"]),
        ({"user_id": "u1", "colour": "red"}, ["body", "colour"]),
        ({"user_id": "u\u0000\n1"}, ["body", "user_id"]),  # control characters: the loaders refuse such ids too
        ({"user_id": "u1\u200b"}, ["body", "user_id"]),  # invisible format characters too (recsys.names)
        ({"user_id": "\ufeffu1"}, ["body", "user_id"]),
    ],
)
def test_invalid_input_is_422_naming_the_field(client: TestClient, body: dict, loc: list[str]) -> None:
    resp = recommend(client, **body)
    assert resp.status_code == 422
    assert [e["loc"] for e in resp.json()["detail"]] == [loc]


def test_malformed_json_is_refused(client: TestClient) -> None:
    resp = client.post("/v1/recommend", content=b'{"user_id": "u1", ', headers={"content-type": "application/json"})
    assert resp.status_code in (400, 422)
    assert resp.json()["detail"][0]["type"] == "json_invalid"


@pytest.mark.parametrize(("body", "status", "kind"), [
    (b'{"user_id": "u1", "k": 5, "k": 50}', 422, "duplicate_key"),
    (b'{"user_id": "u\\ud800x"}', 400, "surrogate"),
    (b'{"user_id": "u1", "context": {"x": 1e309}}', 422, "finite_number"),
])
def test_a_byte_order_mark_does_not_switch_the_body_checks_off(client: TestClient, body: bytes, status: int,
                                                               kind: str) -> None:
    """A UTF-8 BOM does not skip the body checks (which would make the surrogate a 500, the rest a 200)."""
    resp = client.post("/v1/recommend", content=b"\xef\xbb\xbf" + body, headers={"content-type": "application/json"})
    assert resp.status_code == status, resp.text
    assert kind in resp.text
    ok = client.post("/v1/recommend", content=b'\xef\xbb\xbf{"user_id": "u1", "k": 2}',
                     headers={"content-type": "application/json"})
    assert ok.status_code == 200 and len(ok.json()["items"]) == 2


@pytest.mark.parametrize(("encoding", "reads_as"), [
    ("utf-16-le", "it reads as UTF-16-LE (NUL bytes among its first four)"),
    ("utf-16-be", "it reads as UTF-16-BE (NUL bytes among its first four)"),
    ("utf-32-le", "it reads as UTF-32-LE (NUL bytes among its first four)"),
    ("utf-32-be", "it reads as UTF-32-BE (NUL bytes among its first four)"),
    ("utf-16", "it starts with a UTF-16 byte-order mark"),
])
def test_a_utf16_or_utf32_body_is_400_on_every_json_route(online: TestClient, encoding: str, reads_as: str) -> None:
    """Without a BOM such a body is valid UTF-8 (NULs) that ``json.loads(str)`` refuses while the route's
    ``json.loads(bytes)`` decodes it: unless refused up front, every check is skipped (a duplicate "k"
    served with a 200, an unpaired surrogate a 500, a duplicate "item_id" recorded)."""
    bodies = {"/v1/recommend": '{"user_id": "u1", "k": 5, "k": 2}', "/v1/events": '{"user_id": "u\\ud800x"}',
              "/admin/rules/rollback": '{"version": "a", "version": "b"}'}
    headers = {"content-type": "application/json", "x-api-key": ADMIN_KEY}
    for route, text in bodies.items():
        resp = online.post(route, content=text.encode(encoding), headers=headers)
        assert (resp.status_code, resp.json()) == (
            400, {"detail": f"body is not UTF-8: {reads_as}; send JSON as UTF-8"}), route
    refused = re.search(r'recsys_errors_total\{kind="body_not_utf8"\} (\S+)', online.get("/metrics").text)
    assert refused is not None and float(refused.group(1)) == 3.0
    ok = online.post("/v1/recommend", content=b'{"user_id": "u1", "k": 2}', headers=headers)
    assert ok.status_code == 200 and len(ok.json()["items"]) == 2


def test_a_utf8_body_led_by_a_nul_byte_is_named_as_such_not_as_utf16(online: TestClient) -> None:
    """``b'\\x00{...}'`` is UTF-8 with a stray NUL, which json's guess reads as UTF-16-BE: the 400 names
    the NUL, not "it reads as UTF-16-BE". Real UTF-16 keeps its own message."""
    headers = {"content-type": "application/json", "x-api-key": ADMIN_KEY}
    for route in ("/v1/recommend", "/v1/events", "/admin/rules/rollback"):
        resp = online.post(route, content=b'\x00{"user_id": "u001", "k": 3}', headers=headers)
        assert (resp.status_code, resp.json()) == (400, {"detail": "body holds a NUL byte at offset 0 (JSON text has "
                                                                   "none); send the JSON document alone, as UTF-8"})
    refused = re.search(r'recsys_errors_total\{kind="nul_byte"\} (\S+)', online.get("/metrics").text)
    assert refused is not None and float(refused.group(1)) == 3.0
    resp = online.post("/v1/recommend", content='{"user_id": "u1"}'.encode("utf-16-be"), headers=headers)
    assert resp.json() == {"detail": "body is not UTF-8: it reads as UTF-16-BE (NUL bytes among its first four); "
                                     "send JSON as UTF-8"}


@pytest.mark.parametrize("body", [b"\xff\xfe{\x00}\x00", b'\x00{"user_id": "u001"}', b"\xff\xfe\x00"])
def test_a_body_sent_to_admin_reload_is_told_it_takes_none_not_how_to_encode_json(online: TestClient,
                                                                                  body: bytes) -> None:
    """POST /admin/reload takes no body: a UTF-16 one is told so, not to "send JSON as UTF-8"."""
    resp = online.post("/admin/reload", content=body, headers={"content-type": "application/json",
                                                               "x-api-key": ADMIN_KEY})
    assert (resp.status_code, resp.json()) == (422, {"detail": f"POST /admin/reload takes no body (got {len(body)} "
                                                               "bytes): it reloads the served artifact directory"})


def test_a_key_given_twice_is_422_naming_it(client: TestClient) -> None:
    """``{"k": 5, "k": 50}`` used to be served with k=50 (json.loads keeps the last value silently)."""
    resp = client.post("/v1/recommend", content=b'{"user_id": "u1", "k": 5, "k": 50}',
                       headers={"content-type": "application/json"})
    assert resp.status_code == 422
    assert [(e["type"], e["loc"]) for e in resp.json()["detail"]] == [("duplicate_key", ["body", "k"])]
    nested = client.post("/v1/recommend", content=b'{"user_id": "u1", "context": {"a": 1, "a": 2}}',
                         headers={"content-type": "application/json"})
    assert nested.status_code == 422 and nested.json()["detail"][0]["loc"] == ["body", "a"]


def test_a_validation_error_echoing_a_non_finite_number_is_still_written() -> None:
    """FastAPI's own handler failed on such an error ("Out of range float values"): a 500."""
    error = {"type": "less_than_equal", "loc": ("body", "x"), "msg": "Input should be less than or equal to 1",
             "input": float("nan"), "ctx": {"le": float("-inf")}}
    resp = asyncio.run(_validation_error(None, RequestValidationError([error])))  # type: ignore[arg-type]

    def refuse(token: str) -> None:
        raise ValueError(f"{token} in the body")

    assert resp.status_code == 422
    assert json.loads(resp.body, parse_constant=refuse) == {"detail": [
        {**error, "loc": ["body", "x"], "input": "NaN", "ctx": {"le": "-Infinity"}}]}


@pytest.mark.parametrize("field", ["value", "ts"])
def test_event_model_refuses_non_finite_numbers(field: str) -> None:
    """Whatever parsed the JSON: the model itself never lets NaN or infinity into an event."""
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValidationError) as err:
            EventRequest.model_validate({"event_id": "e", "user_id": "u1", "item_id": "m1", "type": "click",
                                         field: bad})
        assert [(e["type"], e["loc"]) for e in err.value.errors()] == [("finite_number", (field,))]


@pytest.mark.parametrize("field", ["user_id", "item_id"])
def test_event_model_refuses_ids_with_control_characters(field: str) -> None:
    event = {"event_id": "e", "user_id": "u1", "item_id": "m1", "type": "click", field: "u\n1"}
    with pytest.raises(ValidationError) as err:
        EventRequest.model_validate(event)
    assert [(e["type"], e["loc"]) for e in err.value.errors()] == [("id_character", (field,))]
    assert "contains a control character ('\\n' at 1)" in str(err.value)  # named, not the pattern echoed


def test_oversized_body_is_413(client: TestClient) -> None:
    big = b'{"user_id": "u1", "context": {"pad": "' + b"x" * 70_000 + b'"}}'
    resp = client.post("/v1/recommend", content=big, headers={"content-type": "application/json"})
    assert resp.status_code == 413
    assert "65536" in resp.json()["detail"]


def test_oversized_chunked_body_without_length_is_413(client: TestClient) -> None:
    def chunks():
        yield b'{"user_id": "u1", "context": {"pad": "'
        for _ in range(10):
            yield b"x" * 8000
        yield b'"}}'

    resp = client.post("/v1/recommend", content=chunks(), headers={"content-type": "application/json"})
    assert resp.status_code == 413


def test_fail_closed_stage_error_is_503_naming_the_stage(toy_dir: Path) -> None:
    broken_rules = StageSpec(name="rules", kind="rules", on_error="fail")
    with client_for(toy_dir, [(RECALL, PopularityRecall), (broken_rules, FailingStage)]) as client:
        resp = recommend(client, user_id="u1", k=2)
    assert resp.status_code == 503
    assert resp.json()["stage"] == "rules"
    assert "'rules'" in resp.json()["detail"] and "toy stage always fails" in resp.json()["detail"]


def test_passthrough_stage_error_falls_back_with_200(toy_dir: Path) -> None:
    flaky = StageSpec(name="coarse", kind="coarse", on_error="passthrough")
    with client_for(toy_dir, [(RECALL, PopularityRecall), (flaky, FailingStage), (RULES, AudienceRules)]) as client:
        data = recommend(client, user_id="u1", k=3).json()
    assert data["fallbacks"] == ["coarse"] and data["path"] == "fallback"
    assert data["stages"][1]["reason"] == "StageError: toy stage always fails"
    assert [i["id"] for i in data["items"]] == ["m4", "m5", "m6"]  # recall's order kept


def test_llm_stage_that_ran_sets_llm_path(toy_dir: Path) -> None:
    llm = StageSpec(name="llm", kind="llm", on_error="passthrough")
    with client_for(toy_dir, [(RECALL, PopularityRecall), (llm, YearRerank), (RULES, AudienceRules)]) as client:
        data = recommend(client, user_id="u1", k=3, llm=True).json()
        light = recommend(client, user_id="u1", k=3).json()  # llm_share defaults to 0
    assert (data["path"], data["route"]) == ("llm", "opt_in")
    assert (light["path"], light["route"]) == ("light", "not_in_share")
    assert [(i["id"], i["score"]) for i in data["items"]] == [("m5", 2010.0), ("m4", 2005.0), ("m6", 1985.0)]


class NonFiniteRerank(YearRerank):
    """A diverged re-ranker: NaN and infinite scores."""

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        bad = np.resize(np.array([np.nan, np.inf, -np.inf], dtype=np.float32), len(candidates))
        return candidates.with_scores("llm", bad)


def test_non_finite_scores_are_served_as_null_not_a_500(toy_dir: Path) -> None:
    llm = StageSpec(name="llm", kind="llm", on_error="passthrough")
    with client_for(toy_dir, [(RECALL, PopularityRecall), (llm, NonFiniteRerank)], debug_api_key=DEBUG_KEY) as client:
        resp = recommend(client, user_id="u1", k=3, llm=True, debug=True)
    assert resp.status_code == 200
    data = resp.json()
    RecommendResponse.model_validate(data)
    assert data["path"] == "llm" and [i["score"] for i in data["items"]] == [None, None, None]
    assert {s["llm"] for s in data["debug"]["item_scores"].values()} == {None}


def test_readyz_is_503_while_loading_then_200(toy_dir: Path, toy_kinds: None, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()
    monkeypatch.setattr(PopularityRecall, "load_gate", gate)
    app = create_app(toy_settings(), toy_dir)
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        loading = client.get("/readyz")
        assert (loading.status_code, loading.json()["status"]) == (503, "loading")
        assert recommend(client, user_id="u1").status_code == 503
        gate.set()
        assert _wait_ready(client).json()["versions"]["rules"] == "toy-rules-1"
        assert [i["id"] for i in recommend(client, user_id="u1", k=1).json()["items"]] == ["m4"]


def test_readyz_reports_a_failed_load(tmp_path: Path, toy_kinds: None) -> None:
    with TestClient(create_app(toy_settings(), tmp_path / "missing")) as client:
        resp = _wait_ready(client, until="failed")
        assert resp.status_code == 503
        assert "split.json" in resp.json()["detail"]
        assert client.get("/healthz").status_code == 200


def test_openapi_and_docs_are_served(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert {"/v1/recommend", "/readyz", "/healthz"} <= set(spec["paths"])
    assert "RecommendResponse" in spec["components"]["schemas"]
    ok = spec["paths"]["/v1/recommend"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/RecommendResponse"}
    assert client.get("/docs").status_code == 200


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_work_offline(client: TestClient, page: str) -> None:
    """Every script, style and icon of the docs pages comes from this server (the pinned wheel)."""
    html = client.get(page).text
    assert "http://" not in html and "https://" not in html and "//cdn" not in html
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert len(assets) >= 2 and all(a.startswith("/") and not a.startswith("//") for a in assets)
    for asset in assets:
        resp = client.get(asset)
        assert resp.status_code == 200 and len(resp.content) > 1000, asset


def test_openapi_declares_the_admin_key_and_the_document_body(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    scheme = spec["components"]["securitySchemes"]["APIKey"]
    assert (scheme["type"], scheme["in"], scheme["name"]) == ("apiKey", "header", "X-API-Key")
    assert "RECSYS_SERVING__ADMIN_API_KEY" in scheme["description"]
    admin_ops = [(path, op) for path, ops in spec["paths"].items() if path.startswith("/admin")
                 for op in ops.values()]
    assert len(admin_ops) == 4  # PUT /admin/{kind}, GET .../versions, POST .../rollback, POST /admin/reload
    assert all(op["security"] == [{"APIKey": []}] for _, op in admin_ops)
    public_ops = [op for path, ops in spec["paths"].items()
                  if path.startswith("/v1/") or path in ("/healthz", "/readyz", "/metrics") for op in ops.values()]
    assert len(public_ops) == 5 and all("security" not in op for op in public_ops)
    body = spec["paths"]["/admin/{kind}"]["put"]["requestBody"]
    assert body["required"] is True and set(body["content"]) == {"application/json", "application/yaml"}
    assert body["content"]["application/json"]["example"]["rules"]


def test_the_documented_example_publishes_a_rule_set(online: TestClient) -> None:
    """What "Try it out" in /docs sends, as JSON and as YAML, is a rule set the server accepts."""
    content = online.get("/openapi.json").json()["paths"]["/admin/{kind}"]["put"]["requestBody"]["content"]
    key = {"X-API-Key": ADMIN_KEY}
    as_json = online.put("/admin/rules", json=content["application/json"]["example"], headers=key)
    assert as_json.status_code == 200 and as_json.json()["status"] == "created"
    as_yaml = online.put("/admin/rules", content=content["application/yaml"]["example"],
                         headers={**key, "content-type": "application/yaml"})
    assert as_yaml.status_code == 200 and as_yaml.json() == {**as_json.json(), "status": "unchanged",
                                                             "sequence": as_yaml.json()["sequence"]}
    assert as_yaml.json()["sequence"] > as_json.json()["sequence"]  # activated again


def _wait_ready(client: TestClient, until: str = "ready", timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while True:
        resp = client.get("/readyz")
        if resp.json()["status"] == until or time.monotonic() > deadline:
            return resp
        time.sleep(0.02)
