"""The console's server side without a browser: pages and assets, its JSON routes, the metrics maths.

Apps are the toy catalog with the real rules stage (``online`` fixture, tests/serving/conftest.py);
expected numbers are worked out by hand in each test.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from recsys.contract import StageTrace
from recsys.experiments import ExperimentsConfig, VariantSpec
from serving.app import create_app
from serving.console.api import line_diff
from serving.console.experiments import latest_analysis, plot_path
from serving.console.pages import CSP, PAGES
from serving.console.summary import MetricsWindow, difference, histogram_quantile, parse_exposition, summarize
from serving.metrics import ServingMetrics
from tests.serving.conftest import ADMIN_KEY, REAL_RULES, toy_pipeline
from tests.serving.toy import DEFAULT_GATES, toy_settings

AUTH = {"X-API-Key": ADMIN_KEY}
REPO = Path(__file__).resolve().parents[2]
INF = math.inf


def test_histogram_quantile_interpolates_within_the_bucket_like_prometheus() -> None:
    buckets = [(0.001, 2.0), (0.005, 6.0), (0.01, 10.0), (INF, 10.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.004)  # rank 5: 3 of the 4 in (1, 5] ms
    assert histogram_quantile(0.1, buckets) == pytest.approx(0.0005)  # rank 1 of 2 in (0, 1] ms
    assert histogram_quantile(0.9, buckets) == pytest.approx(0.00875)  # rank 9: 3 of the 4 in (5, 10] ms
    assert histogram_quantile(0.99, [(0.001, 1.0), (0.01, 1.0), (INF, 4.0)]) == 0.01  # in +Inf: the last bound
    assert histogram_quantile(0.5, [(0.001, 0.0), (INF, 0.0)]) is None
    with pytest.raises(ValueError, match="quantile"):
        histogram_quantile(1.5, buckets)


def test_summary_of_the_apps_own_exposition() -> None:
    metrics = ServingMetrics()
    for seconds in (0.002, 0.002, 0.004, 0.02):
        metrics.observe_answer("light", seconds, [StageTrace("recall", "ok", 1.5, 0, 3),
                                                  StageTrace("llm", "fallback", 40.0, 3, 3)])
    metrics.observe_answer("cache", 0.0005, [])
    for outcome in ("hit", "miss", "miss", "miss"):
        metrics.cache.labels(outcome).inc()
    metrics.redis_errors.inc()
    out = summarize(parse_exposition(metrics.render().decode()))
    # 5 requests: 1 in (0, 1] ms, 2 in (1, 2.5], 1 in (2.5, 5], 1 in (10, 25]
    # p50: rank 2.5 -> 1 + 1.5 * (2.5 - 1) / 2 ms; p95: rank 4.75 -> 10 + 15 * 0.75 ms
    assert out["requests"]["latency_ms"] == {"count": 5.0, "p50": 2.125, "p95": 21.25, "p99": 24.25}
    assert out["requests"]["by_path"]["cache"]["count"] == 1.0
    # all 4 in (1, 2.5] ms: p50 is rank 2 of 4 -> 1 + 1.5 * 2 / 4 ms (bucket resolution, not the true 1.5)
    assert out["stages"]["recall"] == {"count": 4.0, "p50": 1.75, "p95": 2.425, "p99": 2.485}
    assert "llm" not in out["stages"]  # a fallback is not a latency of the stage
    assert out["fallbacks"] == {"llm": 4.0} and out["fallbacks_total"] == 4.0
    assert out["cache"] == {"hits": 1.0, "misses": 3.0, "hit_rate": 0.25}
    assert (out["redis_errors"], out["degraded_requests"]) == (1.0, 0.0)


def test_window_takes_the_newest_snapshot_old_enough_as_baseline() -> None:
    snap = lambda n: {"recsys_requests_total": {frozenset({("path", "light")}): float(n)}}  # noqa: E731
    window = MetricsWindow(window_s=300)
    assert window.observe(snap(1), at=0.0) == (None, None)
    assert window.observe(snap(5), at=100.0) == (None, None)
    assert window.observe(snap(9), at=400.0) == (100.0, snap(5))  # t=0 and t=100 are both old enough
    assert window.observe(snap(12), at=401.0) == (100.0, snap(5))
    assert difference(snap(12), snap(5)) == snap(7)
    assert difference(snap(2), snap(5)) == snap(2)  # counters went back: a restarted worker, start over


def test_line_diff() -> None:
    assert line_diff("a\nb\nc\n", "a\nc\nd\n") == [[" ", "a"], ["-", "b"], [" ", "c"], ["+", "d"]]


def test_pages_and_their_assets_are_served_with_a_same_origin_policy(online: TestClient) -> None:
    root = online.get("/console", follow_redirects=False)
    assert root.status_code == 307 and root.headers["location"] == "/console/try"
    for page in PAGES:
        resp = online.get(f"/console/{page}")
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
        assert resp.headers["content-security-policy"] == CSP
        assets = re.findall(r'(?:src|href)="(/console/static/[^"]+)"', resp.text)
        assert len(assets) == 3 and not re.search(r'(?:src|href)="(?:https?:)?//', resp.text)
        for asset in assets:
            assert online.get(asset).status_code == 200, asset
    assert online.get("/console/nope").status_code == 422
    assert online.get("/console/static/nope.js").status_code == 404
    paths = online.get("/openapi.json").json()["paths"]
    assert "/console/api/health" in paths and "/console/try" not in paths


def test_health_reports_readiness_redis_and_the_window(online: TestClient) -> None:
    for _ in range(3):
        assert online.post("/v1/recommend", json={"user_id": "u1", "k": 3}).status_code == 200
    health = online.get("/console/api/health").json()
    assert (health["ready"], health["status"], health["redis"], health["detail"]) == (True, "ready", True, None)
    assert health["versions"] == online.get("/readyz").json()["versions"]
    m = health["metrics"]
    assert m["window"] == {"since_start": True, "seconds": None}
    assert m["requests"]["latency_ms"]["count"] == 3.0
    assert m["cache"] == {"hits": 2.0, "misses": 1.0, "hit_rate": 0.6667}  # the first answer was computed


def test_version_documents_and_diffs_need_the_key(online: TestClient) -> None:
    doc = {"version": "block-m4", "rules": [{"id": "no_m4", "kind": "blocklist", "items": {"item_ids": ["m4"]}}],
           "acknowledge_dropped_gates": DEFAULT_GATES}
    before = online.get("/admin/rules/versions", headers=AUTH).json()["active"]
    assert online.put("/admin/rules", content=json.dumps(doc), headers=AUTH).status_code == 200
    for path in ("/console/api/rules/versions/block-m4", f"/console/api/rules/diff?base={before}&head=block-m4",
                 "/console/api/experiments", "/console/api/experiments/plots/online_rates.png"):
        assert online.get(path).status_code == 401
        assert online.get(path, headers={"X-API-Key": "wrong"}).json() == {"detail": "missing or wrong X-API-Key"}
    shown = online.get("/console/api/rules/versions/block-m4", headers=AUTH).json()
    assert yaml.safe_load(shown["document"]) == doc
    assert shown["document"].splitlines()[-1] == "version: block-m4"
    diff = online.get(f"/console/api/rules/diff?base={before}&head=block-m4", headers=AUTH).json()
    assert ["+", "version: block-m4"] in diff["lines"] and ["-", f"version: {before}"] in diff["lines"]
    assert ["+", "- id: no_m4"] in diff["lines"] and ["+", "    - m4"] in diff["lines"]
    missing = online.get("/console/api/rules/versions/never", headers=AUTH)
    assert missing.status_code == 404 and missing.json()["detail"] == "rules version 'never' was never published"
    # a version with a slash in it (say "2026/12 tighter") is fetchable, raw or percent-encoded
    slashed = {**doc, "version": "2026/12 block"}
    assert online.put("/admin/rules", content=json.dumps(slashed), headers=AUTH).status_code == 200
    for path in ("/console/api/rules/versions/2026/12 block", "/console/api/rules/versions/2026%2F12%20block"):
        got = online.get(path, headers=AUTH)
        assert got.status_code == 200 and got.json()["version"] == "2026/12 block", path


def _experiment_client(toy_dir: Path) -> TestClient:
    settings = toy_settings(*(spec for spec, _ in REAL_RULES), admin_api_key=ADMIN_KEY).model_copy(update={
        "experiments": ExperimentsConfig(enabled=True, name="exp-1", salt="do-not-show", holdout=0.1, variants=[
            VariantSpec(name="control", share=0.45),
            VariantSpec(name="treatment", share=0.45, overrides={"llm_share": 1.0})])})
    return TestClient(create_app(settings, toy_dir, pipeline=toy_pipeline(toy_dir, settings, REAL_RULES)))


def test_experiments_show_the_config_without_salt_and_the_latest_analysis(toy_dir: Path) -> None:
    with _experiment_client(toy_dir) as client:
        empty = client.get("/console/api/experiments", headers=AUTH).json()
        assert empty["analysis"] is None
        assert empty["config"] == {"enabled": True, "name": "exp-1", "holdout": 0.1, "control": "control", "variants": [
            {"name": "control", "share": 0.45, "overrides": {}},
            {"name": "treatment", "share": 0.45, "overrides": {"llm_share": 1.0}}]}
        assert "do-not-show" not in json.dumps(empty)

        old, new = toy_dir / "ab" / "old", toy_dir / "ab" / "new"
        for folder in (old, new):
            folder.mkdir(parents=True)
            shutil.copy(REPO / "docs" / "ab" / "online_ml100k.json", folder / "online.json")
        shutil.copy(REPO / "docs" / "ab" / "online_rates.png", new / "online_rates.png")
        (new / "notes.json").write_text('{"not": "an analysis"}')
        (new / "broken.json").symlink_to(toy_dir / "gone.json")  # or a file renamed away mid-listing: skipped, no 500
        os.utime(old / "online.json", (1, 1))  # the older one
        found = client.get("/console/api/experiments", headers=AUTH).json()["analysis"]
        assert (found["file"], found["plots"]) == ("ab/new/online.json", ["online_rates.png"])
        assert found["report"]["srm"]["mismatch"] is False and found["report"]["control"] == "control"
        plot = client.get("/console/api/experiments/plots/online_rates.png", headers=AUTH)
        assert plot.status_code == 200 and plot.content[:8] == b"\x89PNG\r\n\x1a\n"
        for name in ("online_missing.png", "..%2Fold%2Fonline.json", "notes.json"):
            assert client.get(f"/console/api/experiments/plots/{name}", headers=AUTH).status_code == 404
    assert latest_analysis(toy_dir / "nowhere") is None
    assert plot_path(toy_dir, "../../etc/passwd") is None
