"""The HTTP backend against the project's own OpenAI-compatible LLM worker (subprocess, tiny model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from cascade.settings import Settings
from llm_rerank.anchored import parse_reason
from llm_rerank.backends import RemoteBackend
from llm_rerank.config import ExplainConfig
from llm_rerank.explain import EvidenceBuilder, ReasonGenerator
from llm_rerank.grounding import ItemFacts
from llm_rerank.remote import RemoteLLM
from llm_rerank.stage import LLMRerankStage
from recsys.config import StageSpec
from recsys.contract import Request, StageError
from serving.server_process import free_port
from tests.llm_rerank.factories import save_tiny_llm, tiny_split

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("remote")
    save_tiny_llm(root / "m")
    tiny_split().save(root / "toy" / "split")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "serving.llm_worker", "--model", str(root / "m"), "--precision",
                             "fp32", "--port", str(port), "--name", "tiny", "--threads", "1"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"LLM server exited: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield url, root
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stderr:
            proc.stderr.close()


def _stage(root: Path, **llm: object) -> LLMRerankStage:
    settings = Settings.build({"artifacts_dir": str(root), "llm": {
        "model": str(root / "m"), "precision": "fp32", "candidates": 5, **llm}})
    stage = LLMRerankStage(StageSpec(name="llm", kind="llm"), settings.llm,
                           artifacts_root=settings.artifacts_dir)
    stage.load(root / "toy")
    return stage


@pytest.mark.parametrize("scoring", ["listwise", "pointwise"])
def test_http_backend_scores_equal_local_scores(served: tuple[str, Path], scoring: str) -> None:
    url, root = served
    local = _stage(root, scoring=scoring)
    remote = _stage(root, scoring=scoring, backend="http", base_url=url)
    assert isinstance(remote.backend, RemoteBackend) and remote.backend.remote.model == "tiny"
    with pytest.raises(ValueError, match="llm.backend is 'http'"):
        remote.local()  # no model in this process
    request = Request(user_id="u1", history=np.array([6, 7, 8]), user_attrs={"age": 30})
    items = np.array([0, 6, 2, 9, 4])
    np.testing.assert_allclose(remote.score(request, items), local.score(request, items), atol=1e-4)


def test_json_schema_output_and_embeddings(served: tuple[str, Path]) -> None:
    url, _ = served
    client = RemoteLLM(url, timeout_s=30)
    schema = {"type": "object", "properties": {"liked": {"type": "boolean"}, "stars": {"enum": [1, 2, 3]}},
              "required": ["liked", "stars"], "additionalProperties": False}
    reply = client.chat_json([{"role": "user", "content": "Rate Toy Story."}], schema, max_tokens=40)
    assert set(reply) == {"liked", "stars"} and isinstance(reply["liked"], bool) and reply["stars"] in (1, 2, 3)
    vecs = client.embed(["Toy Story", "Alien", "Toy Story"])
    assert vecs.shape == (3, 32)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(vecs[0], vecs[2], atol=1e-6)
    text = httpx.post(f"{url}/completions", json={"prompt": "Hello", "max_tokens": 3, "logprobs": 2},
                      timeout=30).json()["choices"][0]
    assert len(text["logprobs"]["tokens"]) == 3 and len(text["logprobs"]["top_logprobs"][0]) == 2
    assert json.dumps(text)  # plain JSON, as an OpenAI client expects


def test_dead_server_raises_stage_error(served: tuple[str, Path]) -> None:
    _, root = served
    stage = _stage(root, backend="http", base_url=f"http://127.0.0.1:{free_port()}/v1", served_model="tiny",
                   http_timeout_s=1.0)
    with pytest.raises(StageError, match="LLM server"):
        stage.score(Request(user_id="u0", history=np.array([1])), np.array([0, 1]))



def test_http_backend_writes_the_reasons_the_local_model_writes(served: tuple[str, Path]) -> None:
    """The same rows, decoded in process over the prefix cache and on the server with the schema as
    structured output: the same greedy JSON, byte for byte, in one call for every row."""
    url, root = served
    cfg = ExplainConfig(max_new_tokens=120)  # room for the longest clause the schema admits
    local = ReasonGenerator(_stage(root), cfg, "movie")
    remote = ReasonGenerator(_stage(root, backend="http", base_url=url, http_timeout_s=60.0), cfg, "movie")
    request = Request(user_id="u0", history=np.array([1, 2, 3, 4]))
    evidence = EvidenceBuilder(ItemFacts.from_items(tiny_split().items)).build(
        request, [0, 5, 6], [["two_tower"], ["popularity"], []])
    assert local.rows(request, evidence) == remote.rows(request, evidence)
    got = remote.generate(request, evidence, deadline=float("inf"))
    assert got == local.generate(request, evidence, deadline=float("inf"))
    assert all(parse_reason(text) is not None for text in got), got
    with pytest.raises(StageError, match="budget"):  # past its deadline nothing is sent
        remote.generate(request, evidence, deadline=time.monotonic() - 1.0)


def test_structured_outputs_other_than_json_are_refused(served: tuple[str, Path]) -> None:
    url, _ = served
    reply = httpx.post(f"{url}/completions", json={"prompt": "Hello", "max_tokens": 3,
                                                   "structured_outputs": {"regex": "[a-z]+"}}, timeout=30)
    assert reply.status_code == 400 and "structured_outputs" in reply.text
