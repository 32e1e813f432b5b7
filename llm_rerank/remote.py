"""HTTP backend of the re-ranker: any OpenAI-compatible server (``vllm serve`` on GPU, or the
project's own CPU worker ``serving.llm_worker``).

Scores come from the next token's log-probabilities (``/v1/completions`` with the prompt as
token ids, ``max_tokens=1``, ``logprobs=k``). The verbalizer tokens (letters, or Yes/No) get
the same large ``logit_bias``, which does not change their relative probabilities but puts
all of them in the returned top-k; vLLM reports post-bias values with
``--logprobs-mode processed_logprobs`` (see configs/vllm/). ``return_tokens_as_token_ids``
makes the keys ``token_id:N`` so no detokenisation is compared. A verbalizer token missing
from the top-k (a server without processed logprobs) gets the lowest seen value minus 10.

JSON output uses ``response_format: {"type": "json_schema", ...}`` (vLLM's structured outputs;
the old ``guided_json`` field was removed and is ignored). Embeddings use ``/v1/embeddings``.

Deliberately left out: retries (the stage's deadline and fallback handle a slow or failed call).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from llm_rerank import verbalizer_scores
from recsys.contract import StageError

BIAS = 100.0


class RemoteLLM:
    """Client of one OpenAI-compatible API root (``.../v1``)."""

    def __init__(self, base_url: str, model: str | None = None, timeout_s: float = 5.0, client: Any = None):
        import httpx  # lazy: only the http backend talks to a server

        self.base_url = base_url.rstrip("/")
        self.http = client or httpx.Client(timeout=timeout_s)
        self.timeout_s = timeout_s
        self._model = model

    @property
    def model(self) -> str:
        if self._model is None:
            data = self._get("/models")["data"]
            if not data:
                raise StageError(f"{self.base_url}/models lists no model")
            self._model = str(data[0]["id"])
        return self._model

    def _get(self, path: str) -> Any:
        return self._send("GET", path, None, self.timeout_s)

    def _post(self, path: str, body: dict[str, Any], timeout_s: float | None = None) -> Any:
        return self._send("POST", path, body, timeout_s or self.timeout_s)

    def _send(self, method: str, path: str, body: dict[str, Any] | None, timeout_s: float) -> Any:
        import httpx  # lazy: only the http backend talks to a server

        try:
            resp = self.http.request(method, self.base_url + path, json=body, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise StageError(f"LLM server {self.base_url}{path}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code != 200:
            raise StageError(f"LLM server {self.base_url}{path}: HTTP {resp.status_code}: {resp.text[:300]}")
        return resp.json()

    def token_logprobs(self, prompts: Sequence[Sequence[int]], token_ids: Sequence[int],
                       timeout_s: float | None = None) -> np.ndarray:
        """[len(prompts), len(token_ids)] next-token log-probabilities of ``token_ids`` after each prompt."""
        body = {"model": self.model, "prompt": [list(map(int, p)) for p in prompts], "max_tokens": 1,
                "temperature": 0.0, "logprobs": min(len(token_ids), 20), "return_tokens_as_token_ids": True,
                "logit_bias": {str(int(t)): BIAS for t in token_ids}}
        if len(token_ids) > 20:
            body["logprobs"] = len(token_ids)  # vLLM needs --max-logprobs >= this (configs/vllm sets 26)
        choices = sorted(self._post("/completions", body, timeout_s)["choices"], key=lambda c: c["index"])
        if len(choices) != len(prompts):
            raise StageError(f"LLM server returned {len(choices)} choices for {len(prompts)} prompts")
        out = np.empty((len(prompts), len(token_ids)), dtype=np.float64)
        for row, choice in enumerate(choices):
            top = (choice.get("logprobs") or {}).get("top_logprobs") or [{}]
            seen = {_token_id(k): float(v) for k, v in (top[0] or {}).items()}
            if not seen:
                raise StageError("LLM server returned no logprobs (is logprobs supported?)")
            floor = min(seen.values()) - 10.0
            out[row] = [seen.get(int(t), floor) for t in token_ids]
        return out

    def listwise_scores(self, prompt: Sequence[int], letter_ids: Sequence[int], n: int,
                        timeout_s: float | None = None) -> np.ndarray:
        """Log-softmax over the first ``n`` letters (``llm_rerank.verbalizer_scores.listwise_scores``)."""
        return verbalizer_scores.listwise_scores(self.token_logprobs([prompt], list(letter_ids[:n]), timeout_s)[0])

    def pointwise_scores(self, prompts: Sequence[Sequence[int]], yes_id: int, no_id: int,
                         timeout_s: float | None = None) -> np.ndarray:
        """P(Yes) / (P(Yes) + P(No)) per prompt (``llm_rerank.verbalizer_scores.pointwise_scores``)."""
        lp = self.token_logprobs(prompts, [yes_id, no_id], timeout_s)
        return verbalizer_scores.pointwise_scores(lp[:, 0], lp[:, 1])

    def chat_json(self, messages: list[dict[str, Any]], schema: dict[str, Any], *, name: str = "output",
                  max_tokens: int = 256) -> Any:
        """The assistant's reply constrained to ``schema``, parsed."""
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": name, "schema": schema, "strict": True}}}
        content = self._post("/chat/completions", body)["choices"][0]["message"]["content"]
        try:
            return json.loads(content)
        except json.JSONDecodeError as exc:
            raise StageError(f"LLM server returned invalid JSON for schema {name!r}: {content[:200]!r}") from exc

    def json_completions(self, prompts: Sequence[Sequence[int]], schema: dict[str, Any], *, max_tokens: int,
                         timeout_s: float | None = None) -> list[str]:
        """One greedy completion per prompt (token ids), each constrained to ``schema`` by the server's
        structured outputs; the texts in prompt order (parsed and checked by the caller)."""
        body = {"model": self.model, "prompt": [list(map(int, p)) for p in prompts], "max_tokens": max_tokens,
                "temperature": 0.0, "structured_outputs": {"json": schema}}
        choices = sorted(self._post("/completions", body, timeout_s)["choices"], key=lambda c: c["index"])
        if len(choices) != len(prompts):
            raise StageError(f"LLM server returned {len(choices)} choices for {len(prompts)} prompts")
        return [str(c.get("text") or "") for c in choices]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        data = self._post("/embeddings", {"model": self.model, "input": list(texts)})["data"]
        return np.asarray([d["embedding"] for d in sorted(data, key=lambda d: d["index"])], dtype=np.float32)

    def close(self) -> None:
        self.http.close()


def _token_id(key: str) -> int:
    if not key.startswith("token_id:"):
        raise StageError(f"LLM server ignored return_tokens_as_token_ids (got key {key!r})")
    return int(key.split(":", 1)[1])
