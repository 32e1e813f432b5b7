"""The re-ranker's scoring backends (``llm_rerank.backends``) on a tiny random model.

The local backend must serve what the stage served before the backend interface existed: the
verbalizer maths over uncached full forward passes (letters' log-softmax, P(Yes)), with the
whole-prefix LRU, the block cache or the batcher. The remote backend, talking to the project's
own worker, must give the same scores; both stop once a request's deadline has passed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from cascade.settings import Settings
from llm_rerank.backends import LocalBackend, RemoteBackend, ScoringBackend, block_cache, build_backend
from llm_rerank.config import BatchingConfig, KVCacheConfig, LLMConfig
from llm_rerank.forward import row_logits
from llm_rerank.prompt import PromptBuilder, PromptParts, pad_token_id
from llm_rerank.remote import RemoteLLM
from llm_rerank.stage import LLMRerankStage
from llm_rerank.verbalizer_scores import listwise_scores, pointwise_scores
from recsys.config import StageSpec
from recsys.contract import Request, StageError
from serving.llm_worker import LLMWorker, create_app
from tests.llm_rerank.factories import save_tiny_llm, tiny_llm, tiny_split

ROOT = Path(__file__).resolve().parents[2]
# RemoteLLM passes its per-call timeout, which the in-process TestClient ignores
pytestmark = pytest.mark.filterwarnings("ignore:You should not use the 'timeout' argument")

REQUEST = Request(user_id="u0", history=np.array([1, 2, 3]), user_attrs={"age": 30})
ITEMS = np.array([0, 6, 2, 9, 4])
VARIANTS: dict[str, dict[str, Any]] = {  # the LLMConfig keys of each local serving path
    "lru": {"kv": {"enabled": False}, "prefix_cache_size": 4},
    "blocks": {"kv": {"enabled": True, "block_tokens": 8}},
    "batched": {"kv": {"enabled": False}, "batching": {"enabled": True, "window_ms": 1}},
}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("artifacts")
    save_tiny_llm(root / "tiny-llm")
    tiny_split().save(root / "toy" / "split")
    return root


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    """The saved model's weights (same seed), as an object apart from any stage's."""
    return tiny_llm()


def make_stage(artifacts: Path, **llm: Any) -> LLMRerankStage:
    settings = Settings.build({"artifacts_dir": str(artifacts), "llm": {
        "model": str(artifacts / "tiny-llm"), "precision": "fp32", "candidates": 5, **llm}})
    stage = LLMRerankStage(StageSpec(name="llm", kind="llm"), settings.llm, artifacts_root=settings.artifacts_dir)
    stage.load(artifacts / "toy")
    return stage


def reference(model: Any, parts: PromptParts, prompts: PromptBuilder, n: int, scoring: str) -> np.ndarray:
    """The stage's scores from first principles: one uncached pass per full row, then the verbalizer."""
    with torch.inference_mode():
        logits = row_logits(model, [parts.prefix + s for s in parts.suffixes], pad_token_id(prompts.tok))
    if scoring == "listwise":
        return listwise_scores(logits[0, prompts.letter_ids[:n]].numpy())
    yes, no = prompts.yes_no
    return pointwise_scores(logits[:, yes].numpy(), logits[:, no].numpy())


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("scoring", ["listwise", "pointwise"])
def test_local_backend_serves_the_uncached_verbalizer_scores(artifacts: Path, tiny: tuple[Any, Any],
                                                             scoring: str, variant: str) -> None:
    model, tok = tiny
    stage = make_stage(artifacts, scoring=scoring, **VARIANTS[variant])
    try:
        assert isinstance(stage.backend, LocalBackend) and stage.local() is stage.backend
        prompts = stage.prompts
        assert prompts is not None
        parts = stage.build_prompt(REQUEST, ITEMS)
        expected = reference(model, parts, prompts, len(ITEMS), scoring)
        if scoring == "listwise":
            assert np.exp(expected).sum() == pytest.approx(1.0, abs=1e-5)
        else:
            assert ((expected > 0) & (expected < 1)).all()
        for _ in range(2):  # the second request finds its prefix cached
            np.testing.assert_allclose(stage.score(REQUEST, ITEMS), expected, rtol=0, atol=1e-5)
        # a backend built around another copy of the weights, outside any stage, serves the same
        own = LocalBackend.from_config(stage.cfg, model, pad_token_id(tok), kv_namespace=f"own-{variant}")
        try:
            for _ in range(2):
                np.testing.assert_allclose(own.score(parts, prompts, len(ITEMS), REQUEST), expected,
                                           rtol=0, atol=1e-5)
        finally:
            own.close()
        stats = stage.cache_stats()
        if variant == "blocks":
            assert stats["kv_tier1_hits"] > 0 and not any(k.startswith("batch_") for k in stats)
        elif variant == "batched":
            assert stats["batch_jobs"] == 2 and not any(k.startswith("kv_") for k in stats)
        else:
            assert stats == {} and stage.local().scorer.cache.hits >= 1
    finally:
        stage.close()
    assert stage.local().batcher is None  # closed: later requests run unbatched
    np.testing.assert_allclose(stage.score(REQUEST, ITEMS), expected, rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def worker(tiny: tuple[Any, Any]) -> Iterator[tuple[TestClient, Any]]:
    """The project's OpenAI-compatible worker in process, on the same weights."""
    model, tok = tiny
    llm = LLMWorker(model, tok, "tiny", window_ms=1.0)
    try:
        with TestClient(create_app(llm)) as client:
            yield client, tok
    finally:
        llm.batcher.close()


@pytest.mark.parametrize("scoring", ["listwise", "pointwise"])
def test_remote_backend_through_the_worker_equals_the_local_backend(tiny: tuple[Any, Any],
                                                                    worker: tuple[TestClient, Any],
                                                                    scoring: str) -> None:
    model, tok = tiny
    client, _ = worker
    prompts = PromptBuilder(tok)
    build = prompts.listwise if scoring == "listwise" else prompts.pointwise
    parts = build(["Toy Story (1995)", "Aladdin (1992)"], {"age": 30},
                  ["Scream (1996)", "Alien (1979)", "Dumbo (1941)", "Psycho (1960)"])
    remote = RemoteBackend(RemoteLLM("http://testserver/v1", client=client), scoring=scoring)  # type: ignore[arg-type]
    local = LocalBackend(model, pad_token_id(tok), scoring=scoring)  # type: ignore[arg-type]
    got = remote.score(parts, prompts, 4, REQUEST)
    assert remote.remote.model == "tiny" and remote.stats() == {}
    np.testing.assert_allclose(got, local.score(parts, prompts, 4, REQUEST), rtol=0, atol=1e-4)
    np.testing.assert_allclose(got, reference(model, parts, prompts, 4, scoring), rtol=0, atol=1e-4)


class Recorder:
    """MockTransport handler: answers ``/completions`` with fixed letter logprobs, records timeouts."""

    def __init__(self, logprobs: dict[int, float]):
        self.logprobs = logprobs
        self.timeouts: list[float] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.timeouts.append(float(request.extensions["timeout"]["read"]))
        n = len(json.loads(request.content)["prompt"])
        top = {f"token_id:{t}": v for t, v in self.logprobs.items()}
        return httpx.Response(200, json={"choices": [{"index": i, "logprobs": {"top_logprobs": [top]}}
                                                     for i in range(n)]})


def test_remote_backend_scores_the_servers_logprobs_within_the_request_budget() -> None:
    prompts = PromptBuilder(tiny_llm()[1])
    a, b, c = prompts.letter_ids[:3]
    recorder = Recorder({a: float(np.log(0.5)), b: float(np.log(0.3)), c: float(np.log(0.2))})
    cfg = LLMConfig(backend="http", base_url="http://llm.test/v1", served_model="m", http_timeout_s=5.0)
    backend = RemoteBackend.from_config(cfg, client=httpx.Client(transport=httpx.MockTransport(recorder)))
    parts = prompts.listwise(["Toy Story (1995)"], {}, ["Scream (1996)", "Alien (1979)", "Dumbo (1941)"])
    # log-probabilities that already sum to 1 over the letters: the scores are those values
    np.testing.assert_allclose(backend.score(parts, prompts, 3, REQUEST), np.log([0.5, 0.3, 0.2]), atol=1e-9)
    soon = Request(user_id="u0", history=np.array([1]), deadline=time.monotonic() + 0.5)
    backend.score(parts, prompts, 3, soon)
    assert recorder.timeouts[0] == 5.0  # no deadline: http_timeout_s
    assert 0 < recorder.timeouts[1] <= 0.5  # the request's remaining budget, not the 5 s
    backend.close()


def _late() -> Request:
    return Request(user_id="u0", history=np.array([1, 2]), deadline=time.monotonic() - 0.01)


@pytest.mark.parametrize("kind", ["local", "local-batched", "remote"])
def test_an_exhausted_deadline_raises_stage_error_before_any_model_work(tiny: tuple[Any, Any], kind: str) -> None:
    model, tok = tiny
    prompts = PromptBuilder(tok)
    parts = prompts.listwise(["Toy Story (1995)"], {}, ["Scream (1996)", "Alien (1979)"])
    calls: list[int] = []
    hook = model.register_forward_pre_hook(lambda _m, _a: calls.append(1))
    recorder = Recorder({})
    backend: ScoringBackend
    if kind == "remote":
        client = httpx.Client(transport=httpx.MockTransport(recorder))
        backend = RemoteBackend(RemoteLLM("http://llm.test/v1", "m", client=client), stage="rerank")
    else:
        batching = BatchingConfig(enabled=True) if kind == "local-batched" else None
        backend = LocalBackend(model, pad_token_id(tok), batching=batching, stage="rerank")
    try:
        assert isinstance(backend, ScoringBackend)
        with pytest.raises(StageError, match="stage 'rerank': request deadline reached"):
            backend.score(parts, prompts, 2, _late())
    finally:
        hook.remove()
        backend.close()
    assert calls == [] and recorder.timeouts == []  # neither the model nor the server was asked


def test_local_deadline_is_checked_between_pointwise_batches(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    prompts = PromptBuilder(tok)
    parts = prompts.pointwise(["Toy Story (1995)"], {}, ["Scream (1996)", "Alien (1979)", "Dumbo (1941)"])
    request = Request(user_id="u0", history=np.array([1]), deadline=time.monotonic() + 0.05)
    passes: list[int] = []

    def slow(_m: Any, _a: Any) -> None:  # the first pass (the prefix) outlives the request's budget
        passes.append(1)
        while request.remaining_s() > 0:
            time.sleep(0.005)

    hook = model.register_forward_pre_hook(slow)
    try:
        backend = LocalBackend(model, pad_token_id(tok), scoring="pointwise", batch_size=1)
        with pytest.raises(StageError, match="deadline reached"):
            backend.score(parts, prompts, 3, request)
    finally:
        hook.remove()
    assert len(passes) == 1  # the prefix ran, no candidate batch did


def test_http_stage_has_no_local_model_and_local_needs_one(artifacts: Path) -> None:
    stage = make_stage(artifacts, backend="http", base_url="http://127.0.0.1:9/v1", served_model="tiny")
    assert isinstance(stage.backend, RemoteBackend) and stage.cache_stats() == {}
    assert stage.backend.timeout_s == stage.cfg.http_timeout_s
    with pytest.raises(ValueError, match="llm.backend is 'http'"):
        stage.local()
    with pytest.raises(StageError, match="before load"):
        LLMRerankStage(None, stage.cfg, artifacts_root=artifacts).local()
    with pytest.raises(ValueError, match="needs a loaded model"):
        build_backend(LLMConfig(backend="local"))
    stage.close()


def test_block_cache_without_a_redis_client_serves_from_tier1_only(tiny: tuple[Any, Any],
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    model, tok = tiny
    with caplog.at_level("WARNING", logger="llm_rerank.backends"):
        blocks = block_cache(model, KVCacheConfig(tier2=True, block_tokens=8), "ns", redis_client=None)
    assert "LLM KV tier 2 off: no Redis client" in caplog.text  # a warning, never a failed start-up
    backend = LocalBackend(model, pad_token_id(tok), blocks=blocks)
    prompts = PromptBuilder(tok)
    parts = prompts.listwise(["Toy Story (1995)"], {}, ["Scream (1996)", "Alien (1979)"])
    first = backend.score(parts, prompts, 2, REQUEST)
    np.testing.assert_allclose(backend.score(parts, prompts, 2, REQUEST), first, rtol=0, atol=1e-5)
    assert backend.stats()["kv_tier1_hits"] > 0 and backend.stats()["kv_tier2_hits"] == 0


def test_importing_the_backends_loads_no_torch() -> None:
    code = ("import sys, llm_rerank.backends; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout[:500]
