"""The operator console in a real headless Chromium against a live uvicorn server.

The server (in a thread of this process, on a free 127.0.0.1 port) serves the toy catalog
(tests/serving/toy.py) through toy popularity recall -> ``YearRerank`` (an LLM-kind stage:
newest first) -> the real rules stage, with admin on, the experiment of docs/ab/experiment.yaml
and its ML-100K analysis copied under the artifact directory's ``ab/``. By hand: u1 (30,
tolerance 1, has seen m1 m2 m3) on the LLM path gets m5 (2010), m4 (2005), m6 (1985); the
cold user "zz" (unknown age) loses m4 to adult_gate and m3 to risk_tolerance.

Needs Debian's ``chromium`` and ``chromium-driver`` and selenium (``.ci/run`` installs them):
without them the tests skip, saying why, and fail where ``CI=true``.

``CONSOLE_CAPTURE=1`` also runs the last test, which saves a screenshot of each page to
docs/console/ and the pages' load times (navigation timing, median of 5 loads) to
results/bench/console_load.json.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import yaml

from recsys.config import StageSpec
from recsys.experiments import ExperimentsConfig
from recsys.provenance import write_result
from recsys.redis_server import EmbeddedRedis
from rules.stage import RulesStage
from serving.app import create_app
from serving.console.pages import PAGES
from serving.server_process import free_port
from tests.serving.conftest import ADMIN_KEY, toy_pipeline
from tests.serving.toy import DEFAULT_GATES, PopularityRecall, YearRerank, save_toy_split, toy_settings

REPO = Path(__file__).resolve().parents[2]
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
PAIRS = [(StageSpec(name="recall", kind="recall", on_error="fail"), PopularityRecall),
         (StageSpec(name="llm", kind="llm"), YearRerank),
         (StageSpec(name="rules", kind="rules", on_error="fail"), RulesStage)]
WAIT_S = 10.0


def _unavailable() -> str | None:
    if CHROMIUM is None or CHROMEDRIVER is None:
        return "no chromium/chromedriver on PATH (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    return None


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    reason = _unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"browser tests cannot run under CI: {reason}")
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--disable-extensions", "--no-first-run"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture(scope="module")
def base(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a live server over the toy catalog, with an experiment and a stored analysis."""
    artifact_dir = tmp_path_factory.mktemp("console")
    _NS.append(artifact_dir.name)
    save_toy_split(artifact_dir)
    (artifact_dir / "ab").mkdir()
    for name in ("online_ml100k.json", "online_rates.png"):
        shutil.copy(REPO / "docs" / "ab" / name, artifact_dir / "ab" / name)
    experiment = yaml.safe_load((REPO / "docs" / "ab" / "experiment.yaml").read_text())["experiments"]
    settings = toy_settings(*(spec for spec, _ in PAIRS), max_k=10, admin_api_key=ADMIN_KEY).model_copy(
        update={"redis_url": redis_server.start(), "experiments": ExperimentsConfig(**experiment)})
    app = create_app(settings, artifact_dir, pipeline=toy_pipeline(artifact_dir, settings, PAIRS))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the console test server did not become ready")
        time.sleep(0.05)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def console_ns(base: str) -> str:
    """The Redis namespace of the console's server: its artifact directory's name, which ``base`` records."""
    return _NS[-1]


_NS: list[str] = []  # the artifact directory names ``base`` served


def redis_server_client(server: EmbeddedRedis) -> Any:
    import redis

    return redis.Redis.from_url(server.start())


def wait_for(driver: Any, condition: Any, what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S).until(condition, message=f"waited {WAIT_S} s for {what}")


def open_page(driver: Any, base: str, page: str) -> None:
    driver.get(f"{base}/console/{page}")
    wait_for(driver, lambda d: d.execute_script("return document.body.dataset.ready") == "true", f"{page} ready")


def set_key(driver: Any, base: str, key: str) -> None:
    """Type ``key`` into the header's admin key form, as an operator would."""
    field = driver.find_element("id", "admin-key")
    field.clear()
    field.send_keys(key)
    driver.find_element("id", "use-key").click()


def severe_console_entries(driver: Any) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def try_users(driver: Any, base: str, users: dict[str, str]) -> dict[str, dict]:
    """Try ``{pane: user}`` on the Try page with the LLM on; each pane's rendering as data."""
    from selenium.webdriver.support.ui import Select

    open_page(driver, base, "try")
    driver.execute_script("sessionStorage.setItem('recsys-console-admin-key', arguments[0])", ADMIN_KEY)  # debug
    Select(driver.find_element("id", "opt-llm")).select_by_value("true")
    for pane, user in users.items():
        field = driver.find_element("css selector", f"#pane-{pane} .user-id")
        field.clear()
        field.send_keys(user)
        driver.execute_script(f"document.querySelector('#pane-{pane}').dataset.state = ''")
    if len(users) == 2:
        driver.find_element("id", "try-both").click()
    else:
        driver.find_element("css selector", f"#pane-{next(iter(users))} .user-form button").click()
    wait_for(driver, lambda d: all(d.execute_script(f"return document.querySelector('#pane-{p}').dataset.state")
                                   == "done" for p in users), "answers")
    return {pane: read_pane(driver, pane) for pane in users}


_READ_PANE = """
const pane = document.querySelector('#pane-' + arguments[0]);
const num = (s) => (s === '' ? null : Number(s));
const rows = (sel) => [...pane.querySelectorAll(sel)];
return {
  error: (pane.querySelector('.message.error') || {}).textContent || null,
  served: rows('table.served tbody tr').map((r) => [r.dataset.item, num(r.querySelector('[data-score]').dataset.score)]),
  path: (pane.querySelector('[data-field="path"] dd') || {}).textContent,
  complete: (pane.querySelector('[data-field="complete"] dd') || {}).textContent,
  stages: rows('li.stage').map((li) => {
    const flow = li.querySelector('.flow');
    return [li.dataset.stage, Number(flow.dataset.nIn), Number(flow.dataset.nOut),
            [...li.querySelectorAll('.stage-items li')].map((i) => [i.dataset.item, num(i.dataset.score)])];
  }),
  matrix: Object.fromEntries(rows('table.matrix tbody tr').map((r) => [r.dataset.item,
    Object.fromEntries([...r.querySelectorAll('td[data-stage]')].map((c) => [c.dataset.stage, num(c.dataset.score)]))])),
  removed: rows('table.removed tbody tr').map((r) => [r.dataset.item, r.querySelector('.rule').textContent]),
  handoffs: rows('details.handoff').map((d) => [d.dataset.stage, Number(d.dataset.n),
    [...d.querySelectorAll('table.handoff-items tbody tr')].map((r) => [r.dataset.item, num(r.dataset.score)])]),
};
"""


def read_pane(driver: Any, pane: str) -> dict:
    return driver.execute_script(_READ_PANE, pane)


def api_answer(base: str, user: str) -> dict:
    resp = httpx.post(base + "/v1/recommend", json={"user_id": user, "k": 10, "debug": True, "llm": True},
                      headers={"X-API-Key": ADMIN_KEY}, timeout=10)
    resp.raise_for_status()
    return resp.json()


@pytest.mark.parametrize("page", PAGES)
def test_page_loads_without_console_errors_from_this_server_only(driver: Any, base: str, page: str) -> None:
    open_page(driver, base, "health")
    driver.execute_script("sessionStorage.setItem('recsys-console-admin-key', arguments[0])", ADMIN_KEY)
    driver.get_log("browser")  # start clean
    open_page(driver, base, page)
    if page == "experiments":  # the analysis and its plot arrive after the first render
        wait_for(driver, lambda d: d.execute_script(
            "const i = document.querySelector('#plots img'); return !!i && i.complete && i.naturalWidth > 0"), "plot")
    assert severe_console_entries(driver) == []
    resources = driver.execute_script("return performance.getEntriesByType('resource').map((r) => r.name)")
    assert resources and all(name.startswith(base + "/") for name in resources), resources
    text = driver.find_element("tag name", "main").text
    expected = {"try": "Try both users", "rules": "active: ", "experiments": "fusion-vs-coarse",
                "health": "ready"}[page]
    assert expected in text


def test_try_shows_the_api_debug_items_and_scores_stage_by_stage(driver: Any, base: str) -> None:
    shown = try_users(driver, base, {"a": "u1", "b": "zz"})
    for pane, user in (("a", "u1"), ("b", "zz")):
        api, page = api_answer(base, user), shown[pane]
        assert page["error"] is None
        assert page["served"] == [[i["id"], i["score"]] for i in api["items"]]
        assert page["path"] == api["path"] == "llm"
        short = f"no, short by {api['short_by']}" + (f" ({api['short_reason']})" if api["short_reason"] else "")
        assert page["complete"] == ("yes" if api["complete"] else short)
        assert [s[:3] for s in page["stages"]] == [[s["name"], s["n_in"], s["n_out"]] for s in api["stages"]]
        scores = api["debug"]["item_scores"]
        assert page["matrix"] == scores
        for name, _, _, items in page["stages"]:
            column = [(item, s[name]) for item, s in scores.items() if s.get(name) is not None]
            assert items == [list(p) for p in sorted(column, key=lambda p: -p[1])]
        assert page["removed"] == [[r["id"], r["reason"]] for r in api["debug"]["removed"]]
        # each stage's whole hand-off, as the debug JSON lists it (recall's candidates beyond the served ones too)
        assert page["handoffs"] == [[h["stage"], h["n"], [[i["id"], i["score"]] for i in h["items"]]]
                                    for h in api["debug"]["handoffs"]]
        assert page["handoffs"] and page["handoffs"][0][0] == "recall"
    assert [i for i, _ in shown["a"]["served"]] == ["m5", "m4", "m6"]
    assert shown["b"]["removed"] == [["m4", "adult_gate"], ["m3", "risk_tolerance"]]
    assert [s[0] for s in shown["a"]["stages"]][:3] == ["recall", "llm", "rules"]
    assert dict(shown["a"]["stages"][0][3])["m5"] == 2.0  # recall popularity count, from the JSON


def test_try_needs_the_key_for_debug_and_never_logs_impressions(driver: Any, base: str, redis_server: EmbeddedRedis,
                                                                   console_ns: str) -> None:
    """The Try page used to answer debug requests to anyone and log its answers as experiment impressions."""
    client = redis_server_client(redis_server)
    stream = f"{console_ns}:events"
    before = client.xlen(stream) if client.exists(stream) else 0
    shown = try_users(driver, base, {"a": "u1", "b": "zz"})
    assert all(p["error"] is None and p["served"] for p in shown.values())
    assert (client.xlen(stream) if client.exists(stream) else 0) == before  # nothing logged for the console
    driver.execute_script("sessionStorage.removeItem('recsys-console-admin-key')")
    driver.find_element("css selector", "#pane-a .user-form button").click()
    wait_for(driver, lambda d: "403: debug answers need X-API-Key" in (
        d.find_element("css selector", "#pane-a .result").text), "the 403 detail")


def _alert(driver: Any) -> Any:
    from selenium.common.exceptions import NoAlertPresentException  # lazy, as the other selenium imports

    try:
        return driver.switch_to.alert
    except NoAlertPresentException:
        return None


def _publish(driver: Any, text: str) -> str:
    driver.execute_script("document.querySelector('#message').textContent = ''")
    box = driver.find_element("id", "publish-text")
    box.clear()
    box.send_keys(text)
    driver.find_element("id", "publish").click()
    return wait_for(driver, lambda d: d.find_element("id", "message").text, "the publish answer")


def test_publishing_a_block_rule_removes_the_top_item_and_rollback_brings_it_back(driver: Any, base: str) -> None:
    top = try_users(driver, base, {"a": "u1"})["a"]["served"][0][0]
    open_page(driver, base, "rules")
    set_key(driver, base, ADMIN_KEY)
    row = wait_for(driver, lambda d: d.find_elements("css selector", "table.versions tr[data-active='true']"),
                   "the versions table")[0]
    before = row.get_attribute("data-version")
    doc = {"version": f"console-block-{top}", "rules": [{"id": "console_block", "kind": "blocklist",
                                                          "items": {"item_ids": [top]}}],
           "acknowledge_dropped_gates": DEFAULT_GATES}
    said = _publish(driver, yaml.safe_dump(doc))
    assert said.startswith(f"published rules console-block-{top}"), said
    driver.find_element("css selector", "#diff-form button").click()  # the newest two: before -> new
    wait_for(driver, lambda d: "diff" in d.find_element("id", "viewer-title").text, "the diff")
    added = [e.text for e in driver.find_elements("css selector", "#viewer .add")]
    assert f"+     - {top}" in added

    blocked = try_users(driver, base, {"a": "u1"})["a"]
    assert top not in [i for i, _ in blocked["served"]] and [top, "console_block"] in blocked["removed"]

    open_page(driver, base, "rules")
    wait_for(driver, lambda d: d.find_elements("css selector", f"tr[data-version='{before}'] button.rollback"),
             "the rollback button").pop().click()
    alert = wait_for(driver, lambda d: _alert(d), "the question whether to drop the block rule's gate")
    assert "blocklist:console_block" in alert.text
    alert.accept()  # the console sends the rollback again, acknowledging that gate
    said = wait_for(driver, lambda d: d.find_element("id", "message").text, "the rollback answer")
    assert said == f"rolled back: rules {before} is active"
    assert try_users(driver, base, {"a": "u1"})["a"]["served"][0][0] == top


def test_an_invalid_document_shows_the_api_422_detail(driver: Any, base: str) -> None:
    open_page(driver, base, "rules")
    set_key(driver, base, ADMIN_KEY)
    wait_for(driver, lambda d: d.find_elements("css selector", "table.versions"), "the versions table")
    said = _publish(driver, "version: broken-1\nrules:\n  - {id: x, kind: no_such_kind}\n")
    detail = httpx.put(base + "/admin/rules", content="version: broken-1\nrules:\n  - {id: x, kind: no_such_kind}\n",
                       headers={"X-API-Key": ADMIN_KEY}).json()["detail"]
    assert said == f"422: {detail}"
    assert "error" in driver.find_element("id", "message").get_attribute("class")


def test_a_wrong_admin_key_shows_the_401_message(driver: Any, base: str) -> None:
    open_page(driver, base, "rules")
    set_key(driver, base, "not-the-key")
    said = wait_for(driver, lambda d: d.find_element("id", "message").text.startswith("401") and
                    d.find_element("id", "message").text, "the 401 message")
    assert said == "401: missing or wrong X-API-Key"
    assert driver.find_elements("css selector", "table.versions") == []


_TIMING = """
const nav = performance.getEntriesByType('navigation')[0];
const ready = performance.getEntriesByName('console-ready')[0];
return {response_end_ms: nav.responseEnd, dom_content_loaded_ms: nav.domContentLoadedEventEnd,
        load_event_ms: nav.loadEventEnd, ready_ms: ready ? ready.startTime : null};
"""


@pytest.mark.skipif(not os.environ.get("CONSOLE_CAPTURE"), reason="set CONSOLE_CAPTURE=1 to refresh docs/console/*.png "
                                                                  "and results/bench/console_load.json")
def test_capture_screenshots_and_load_times(driver: Any, base: str) -> None:
    out_dir = REPO / "docs" / "console"
    out_dir.mkdir(parents=True, exist_ok=True)
    for i in range(20):  # some traffic for the Health page, cache hits included
        httpx.post(base + "/v1/recommend", json={"user_id": f"u{1 + i % 3}", "k": 5}, timeout=10)
    open_page(driver, base, "health")
    driver.execute_script("sessionStorage.setItem('recsys-console-admin-key', arguments[0])", ADMIN_KEY)
    timings: dict[str, Any] = {}
    for page in PAGES:
        runs = []
        for _ in range(5):
            open_page(driver, base, page)
            wait_for(driver, lambda d: d.execute_script(
                "return performance.getEntriesByType('navigation')[0].loadEventEnd > 0"), "load event")
            runs.append(driver.execute_script(_TIMING))
        timings[page] = {key: round(statistics.median(r[key] for r in runs), 1) for key in runs[0]}
    try_users(driver, base, {"a": "u1", "b": "zz"})
    _shoot(driver, out_dir / "try.png")
    auth = {"X-API-Key": ADMIN_KEY}
    active = httpx.get(base + "/admin/rules/versions", headers=auth).json()["active"]
    doc = yaml.safe_load(httpx.get(f"{base}/console/api/rules/versions/{active}", headers=auth).json()["document"])
    doc["version"] = f"{active}-no-m5"
    doc["rules"].insert(0, {"id": "withdrawn_m5", "kind": "blocklist", "description": "Echo is withdrawn.",
                            "items": {"item_ids": ["m5"]}})
    assert httpx.put(base + "/admin/rules", content=json.dumps(doc), headers=auth).status_code == 200
    open_page(driver, base, "rules")
    driver.find_element("css selector", "#diff-form button").click()
    wait_for(driver, lambda d: d.find_elements("css selector", "#viewer .add"), "the diff")
    _shoot(driver, out_dir / "rules.png")
    httpx.post(base + "/admin/rules/rollback", json={"version": active}, headers=auth)
    for page in ("experiments", "health"):
        open_page(driver, base, page)
        time.sleep(0.3)  # plots decode after the ready mark
        _shoot(driver, out_dir / f"{page}.png")
    report = {"what": "console page load in headless Chromium over loopback, toy catalog; "
                      "median of 5 loads; ms from navigation start",
              "chromium": driver.capabilities.get("browserVersion"), "pages": timings}
    write_result(REPO / "results" / "bench" / "console_load.json", report)


def _shoot(driver: Any, path: Path) -> None:
    """The whole page, not just the window: the viewport is stretched to the document's height."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    metrics = {"width": 1400, "height": min(max(height, 700), 3000), "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    time.sleep(0.2)
    driver.save_screenshot(str(path))
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
