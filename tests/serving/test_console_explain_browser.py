"""The console's "Try a request" shows each top item's reason and who wrote it, in a real headless
Chromium against a live uvicorn server: toy popularity recall -> the real LLM stage over a tiny
random model (which writes the reasons) -> toy audience rules. The reasons shown are the API's:
the page's request writes them into the Redis reason cache, and the API request after it reads
the same ones back.

Needs Debian's ``chromium`` and ``chromium-driver`` and selenium, as tests/serving/test_console_browser.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from cascade.settings import Settings
from llm_rerank.stage import LLMRerankStage
from recsys.config import StageSpec
from recsys.redis_server import EmbeddedRedis
from serving.app import create_app
from serving.server_process import free_port
from tests.llm_rerank.factories import save_tiny_llm
from tests.serving.conftest import ADMIN_KEY, toy_pipeline
from tests.serving.test_console_browser import driver, open_page, wait_for  # noqa: F401 (driver: a fixture)
from tests.serving.toy import AudienceRules, PopularityRecall, save_toy_split

PAIRS = [(StageSpec(name="recall", kind="recall", on_error="fail"), PopularityRecall),
         (StageSpec(name="llm", kind="llm", depth=20), LLMRerankStage),
         (StageSpec(name="rules", kind="rules", on_error="fail"), AudienceRules)]

_READ_REASONS = """
return [...document.querySelectorAll('#pane-a table.served tbody tr')].map((r) => {
  const cell = r.querySelector('td.reason');
  return [r.dataset.item, cell && cell.dataset.source ? cell.dataset.source : null,
          cell && cell.querySelector('.reason-text') ? cell.querySelector('.reason-text').textContent : null];
});
"""


@pytest.fixture(scope="module")
def explain_base(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    artifact_dir = tmp_path_factory.mktemp("console-explain")
    save_toy_split(artifact_dir)
    llm = save_tiny_llm(tmp_path_factory.mktemp("llm") / "tiny-llm")
    settings = Settings.build({
        "redis_url": redis_server.start(),
        "pipeline": {"max_k": 10, "stages": [s.model_dump() for s, _ in PAIRS]},
        "serving": {"admin_api_key": ADMIN_KEY, "explain_needs_key": False},  # end users authenticated upstream
        "llm": {"model": str(llm), "precision": "fp32", "candidates": 5,
                "explain": {"model": "pipeline", "budget_ms": 60_000}}})
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


def test_try_shows_each_reason_and_its_source(driver: Any, explain_base: str) -> None:  # noqa: F811
    open_page(driver, explain_base, "try")
    driver.find_element("id", "opt-debug").click()  # off: no key needed
    driver.find_element("id", "opt-explain").click()
    k = driver.find_element("id", "opt-k")
    k.clear()
    k.send_keys("4")
    field = driver.find_element("css selector", "#pane-a .user-id")
    field.send_keys("u1")
    driver.find_element("css selector", "#pane-a .user-form button").click()
    wait_for(driver, lambda d: d.execute_script("return document.querySelector('#pane-a').dataset.state") == "done",
             "the answer")
    shown = driver.execute_script(_READ_REASONS)
    api = httpx.post(explain_base + "/v1/recommend", json={"user_id": "u1", "k": 4, "explain": True},
                     timeout=60).json()
    expected = [[i["id"], i.get("reason_source"), i.get("reason")] for i in api["items"]]
    assert shown == expected
    assert [row[1] in ("llm", "template") for row in shown] == [True] * min(3, len(shown))
    header = driver.execute_script(
        "return [...document.querySelectorAll('#pane-a table.served thead th')].map((t) => t.textContent)")
    assert header[-1] == "reason"
