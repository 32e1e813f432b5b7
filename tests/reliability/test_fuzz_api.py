"""Property-based fuzzing of the HTTP API from its own OpenAPI schema (schemathesis, in-process ASGI).

Every operation of ``/openapi.json`` gets generated calls, valid and invalid, against an
app built by ``serving.app.create_app`` over the toy catalog with the real rules stage and
a real Redis (admin calls carry the key, so the admin validation is fuzzed too; the 401
path is tested in ``test_admin_security``). No call may get a 5xx, and every 4xx must
say why (a non-empty ``detail``). The number of generated calls is printed at the end
(run with ``-s``): ``fuzzed N calls``.

Schemathesis generates strict JSON, which has no NaN or Infinity; Python's ``json`` (and so
the server) reads them all the same, and ``1e309`` overflows to infinity. So a share of the
generated JSON bodies gets a non-finite number (drawn from hypothesis' ``floats`` with NaN
and infinities allowed, or an overflowing literal) in place of one of its values, and those
calls must be a 422 ``finite_number`` naming that value's field.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from cascade.registry import STAGE_KINDS
from cascade.settings import ENV_REDIS_URL
from recsys.redis_server import EmbeddedRedis
from serving.app import create_app
from tests.reliability.conftest import ADMIN_KEY
from tests.serving.conftest import REAL_RULES, toy_pipeline
from tests.serving.toy import TOY_KINDS, save_toy_split, toy_settings

CALLS: Counter[str] = Counter()
# JSON spellings of non-finite numbers: NaN / Infinity / -Infinity, and literals that overflow a double
NON_FINITE = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not math.isfinite(x)).map(json.dumps),
    st.sampled_from(["1e309", "-1e400", "123.0e999"]),
)
_MARK = "__non_finite__"


@pytest.fixture(scope="module")
def api_schema(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    artifact_dir = tmp_path_factory.mktemp("fuzz")
    save_toy_split(artifact_dir)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV_REDIS_URL, redis_server.start())
        mp.setitem(STAGE_KINDS, "recall", TOY_KINDS["recall"])  # for /admin/reload's rebuild
        cfg = toy_settings(*(spec for spec, _ in REAL_RULES), admin_api_key=ADMIN_KEY)
        app = create_app(cfg, artifact_dir, pipeline=toy_pipeline(artifact_dir, cfg, REAL_RULES))
        with TestClient(app):  # runs the lifespan: Redis backend attached, ready
            yield schemathesis.openapi.from_asgi("/openapi.json", app)
    print(f"\nfuzzed {sum(CALLS.values())} calls: {dict(sorted(CALLS.items()))}")


@pytest.mark.slow
def test_no_server_error_and_every_4xx_says_why(api_schema: Any) -> None:
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 9
    for operation in operations:
        for mode in schemathesis.GenerationMode:  # valid calls, then schema-violating ones
            fuzz_operation(operation, mode)
    assert sum(CALLS.values()) >= 9 * 20


def fuzz_operation(operation: Any, mode: schemathesis.GenerationMode) -> None:
    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None,
              derandomize=True)
    @given(case=operation.as_strategy(generation_mode=mode), data=st.data())
    def check(case: Any, data: st.DataObject) -> None:
        headers = {"X-API-Key": ADMIN_KEY} if case.path.startswith(("/admin", "/console/api")) else None
        poisoned = _poison(case, data)
        response = case.call(headers=headers)
        label = "non-finite" if poisoned else mode.value
        CALLS[f"{label} {case.method} {case.path} {response.status_code}"] += 1
        assert response.status_code < 500, (  # the app is ready and Redis is up: not even a 503
            f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:500]}")
        if 400 <= response.status_code < 500:
            detail = response.json().get("detail")
            assert detail, f"{response.status_code} without a detail: {response.text[:300]}"
        if poisoned is not None and case.method == "POST":  # the JSON routes; PUT reads YAML, where NaN is text
            assert response.status_code == 422 and response.json()["detail"][0]["type"] == "finite_number"
            assert response.json()["detail"][0]["loc"] == ["body", *poisoned]

    try:
        check()
    except Unsatisfiable:
        if mode is schemathesis.GenerationMode.POSITIVE:
            raise
        # an operation without parameters or body (GET /healthz) has nothing to violate


def _poison(case: Any, data: st.DataObject) -> list[str] | None:
    """Put a non-finite number in place of one value of a JSON object body (1 call in 3); its path."""
    if not isinstance(case.body, dict) or not case.body or "json" not in (case.media_type or ""):
        return None
    if data.draw(st.integers(0, 2), label="poison") != 0:
        return None
    key = data.draw(st.sampled_from(sorted(case.body)), label="poisoned key")
    token = data.draw(NON_FINITE, label="non-finite")
    case.body = json.dumps({**case.body, key: _MARK}).replace(json.dumps(_MARK), token).encode()
    return [key]


def test_schema_lists_every_route(api_schema: Any) -> None:
    paths = set(api_schema.raw_schema["paths"])
    assert {"/v1/recommend", "/v1/events", "/admin/reload", "/admin/{kind}", "/readyz"} <= paths
