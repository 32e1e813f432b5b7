"""The OpenAI-compatible CPU LLM worker (``serving.llm_worker``), in process on a tiny random model.

The subprocess round trip through the stage's HTTP backend is ``tests/llm_rerank/test_remote.py``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from llm_rerank.forward import listwise_from_logits, pointwise_from_logits, row_logits
from llm_rerank.prompt import PromptBuilder, pad_token_id
from llm_rerank.remote import RemoteLLM
from serving.llm_worker import LLMWorker, create_app, main
from tests.llm_rerank.factories import ANIMATION, HORROR, tiny_llm

ROOT = Path(__file__).resolve().parents[2]
# RemoteLLM passes its per-call timeout, which the in-process TestClient ignores
pytestmark = pytest.mark.filterwarnings("ignore:You should not use the 'timeout' argument")


@pytest.fixture(scope="module")
def worker() -> Iterator[tuple[LLMWorker, RemoteLLM, PromptBuilder]]:
    model, tok = tiny_llm()
    worker = LLMWorker(model, tok, "tiny", window_ms=1.0)
    with TestClient(create_app(worker)) as client:
        yield worker, RemoteLLM("http://testserver/v1", client=client), PromptBuilder(tok)
    worker.batcher.close()


def test_worker_scores_are_the_local_scores(worker: tuple[LLMWorker, RemoteLLM, PromptBuilder]) -> None:
    """Worker logprobs -> ``llm_rerank.verbalizer_scores`` == local logits -> the same maths (both modes)."""
    llm, remote, builder = worker
    listwise = builder.listwise(ANIMATION[:3], {"age": 30}, HORROR[:5])
    pointwise = builder.pointwise(HORROR[:2], {}, ANIMATION[:4])
    pad = pad_token_id(builder.tok)
    with torch.inference_mode():
        local_list = row_logits(llm.model, [listwise.prefix + listwise.suffixes[0]], pad)
        local_point = row_logits(llm.model, [pointwise.prefix + s for s in pointwise.suffixes], pad)
    got = remote.listwise_scores(listwise.prefix + listwise.suffixes[0], builder.letter_ids, 5)
    np.testing.assert_allclose(got, listwise_from_logits(local_list, builder.letter_ids, 5), atol=1e-5)
    got = remote.pointwise_scores([pointwise.prefix + s for s in pointwise.suffixes], *builder.yes_no)
    np.testing.assert_allclose(got, pointwise_from_logits(local_point, *builder.yes_no), atol=1e-5)
    assert remote.model == "tiny"


def test_worker_refuses_a_model_directory_that_is_not_a_model(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--model", str(tmp_path)])
    assert exit_.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ") and "no config.json" in line


def test_the_stage_package_imports_no_http_server() -> None:
    """The worker is serving's: ``llm_rerank`` stays free of FastAPI, uvicorn and ``serving``."""
    banned = {"fastapi", "uvicorn", "starlette", "serving"}
    found = []
    for path in sorted((ROOT / "llm_rerank").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            found += [f"{path.name}:{node.lineno} {n}" for n in names if n.split(".")[0] in banned]
    assert not found, found
