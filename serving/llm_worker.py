"""The project's CPU LLM worker: the subset of vLLM's OpenAI-compatible API the re-ranker uses.

One process loads the model and serves, on loopback by default:

- ``POST /v1/completions``: ``prompt`` as text or token ids (one or a list), greedy decoding,
  ``logprobs`` = top-k of each generated token after ``logit_bias`` (what vLLM returns with
  ``--logprobs-mode processed_logprobs``), ``return_tokens_as_token_ids`` keys ``token_id:N``,
  ``structured_outputs: {"json": schema}`` constrains every completion with xgrammar (vLLM's field).
  Single-token requests of all API workers go through one ``DynamicBatcher`` (shared forward
  passes, length-grouped, at most ``window_ms`` of waiting).
- ``POST /v1/chat/completions``: chat template + greedy decoding; ``response_format``
  ``{"type": "json_schema", "json_schema": {"schema": ...}}`` constrains the output with
  xgrammar (the grammar engine vLLM uses).
- ``POST /v1/embeddings``: mean-pooled last hidden state, L2-normalised.
- ``GET /v1/models``, ``GET /health``.

So ``llm_rerank.remote`` is the same client for this worker (CPU, CI) and ``vllm serve`` (GPU).
Run: ``python -m serving.llm_worker --model NAME|DIR [--precision bf16] [--port 8100]`` (NAME: a
packaged backbone, ``llm_rerank.packaged_backbones``). It lives in ``serving`` (an HTTP entry point over the
stage package's model runtime); ``llm_rerank`` itself never imports FastAPI.

Deliberately left out: sampling (temperature is ignored: scoring and tagging are greedy),
streaming, authentication (bind to loopback or a private network).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict

from llm_rerank.backbone import load_model, resolve_model
from llm_rerank.batching import DynamicBatcher
from llm_rerank.config import LLMConfig
from llm_rerank.forward import row_logits
from llm_rerank.prompt import pad_token_id


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int = 16
    logprobs: int | None = None
    logit_bias: dict[str, float] | None = None
    return_tokens_as_token_ids: bool = False
    structured_outputs: dict[str, Any] | None = None  # {"json": <JSON schema>}: every completion follows it


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[dict[str, Any]]
    max_tokens: int = 128
    response_format: dict[str, Any] | None = None


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    input: str | list[str]


class LLMWorker:
    """Model + tokenizer + batcher; the endpoints' logic, callable without HTTP."""

    def __init__(self, model: Any, tokenizer: Any, name: str, *, window_ms: float = 10.0, max_batch: int = 8):
        self.model, self.tok, self.name = model, tokenizer, name
        self.pad_id = pad_token_id(tokenizer)
        self.lock = threading.Lock()  # one model call at a time; the batcher merges the waiting ones
        self.batcher = DynamicBatcher(self._batch, window_ms=window_ms, max_batch=max_batch)
        self._grammars: dict[str, Any] = {}

    def _batch(self, rows_per_job: Sequence[Any]) -> list[Any]:
        rows = [r for job in rows_per_job for r in job]
        with self.lock, torch.inference_mode():
            logits = row_logits(self.model, rows, self.pad_id)
        out, start = [], 0
        for job in rows_per_job:
            out.append(logits[start : start + len(job)])
            start += len(job)
        return out

    def _token_key(self, tid: int, as_ids: bool) -> str:
        return f"token_id:{tid}" if as_ids else self.tok.decode([tid])

    def _prompts(self, prompt: Any) -> list[list[int]]:
        if isinstance(prompt, str):
            prompt = [prompt]
        if prompt and isinstance(prompt[0], int):
            prompt = [prompt]
        out = [list(self.tok(p, add_special_tokens=False)["input_ids"]) if isinstance(p, str) else list(p)
               for p in prompt]
        if not out or any(len(p) == 0 for p in out):
            raise HTTPException(400, "prompt must be non-empty text or token ids")
        return out

    def _step(self, logits: Any, bias: dict[int, float], k: int, as_ids: bool) -> tuple[int, float, dict[str, float]]:
        logits = logits.float().clone()
        for tid, b in bias.items():
            logits[tid] += b
        logp = torch.log_softmax(logits, dim=-1)
        tid = int(torch.argmax(logp))
        top = {}
        if k:
            vals, idx = torch.topk(logp, k)
            top = {self._token_key(int(i), as_ids): float(v) for v, i in zip(vals, idx, strict=True)}
        return tid, float(logp[tid]), top

    def complete(self, req: CompletionRequest) -> dict[str, Any]:
        prompts = self._prompts(req.prompt)
        bias = {int(k): float(v) for k, v in (req.logit_bias or {}).items()}
        k = min(int(req.logprobs or 0), 50)
        choices = []
        schema = self._structured_schema(req.structured_outputs)
        if req.max_tokens == 1 and schema is None:  # the scoring path: batched across concurrent requests
            first = self.batcher.submit(prompts, length=max(len(p) for p in prompts)).result()
            steps = [[self._step(first[i], bias, k, req.return_tokens_as_token_ids)] for i in range(len(prompts))]
        else:
            steps = [self._greedy(p, req.max_tokens, bias, k, req.return_tokens_as_token_ids,
                                  None if schema is None else _Grammar(self._compiled(schema)))
                     for p in prompts]
            if schema is not None:  # the stop token that ends a constrained completion is not part of its text
                steps = [[s for s in st if s[0] != self.tok.eos_token_id] for st in steps]
        for i, st in enumerate(steps):
            tokens = [t for t, _, _ in st]
            lp = None if req.logprobs is None else {
                "tokens": [self._token_key(t, req.return_tokens_as_token_ids) for t in tokens],
                "token_logprobs": [p for _, p, _ in st], "top_logprobs": [top for _, _, top in st],
                "text_offset": [0] * len(st)}
            choices.append({"index": i, "text": self.tok.decode(tokens), "logprobs": lp, "finish_reason": "length"})
        return {"id": f"cmpl-{uuid.uuid4().hex[:12]}", "object": "text_completion", "created": int(time.time()),
                "model": self.name, "choices": choices,
                "usage": {"prompt_tokens": sum(map(len, prompts)), "completion_tokens": sum(map(len, steps))}}

    def _greedy(self, ids: list[int], max_tokens: int, bias: dict[int, float], k: int, as_ids: bool,
                grammar: Any = None) -> list[tuple[int, float, dict[str, float]]]:
        from transformers import DynamicCache  # lazy: imports transformers (and torch)

        cache, out, step_ids = DynamicCache(), [], ids
        stop = {self.tok.eos_token_id}
        with self.lock, torch.inference_mode():
            for _ in range(max_tokens):
                logits = self.model(input_ids=torch.tensor([step_ids]), cache=cache, use_cache=True,
                                    logits_to_keep=1).logits[0, -1].float()
                if grammar is not None:
                    logits = grammar.mask(logits)
                tid, lp, top = self._step(logits, bias, k, as_ids)
                out.append((tid, lp, top))
                if grammar is not None and grammar.accept(tid):
                    break
                if grammar is None and tid in stop:
                    break
                step_ids = [tid]
        return out

    @staticmethod
    def _structured_schema(structured: dict[str, Any] | None) -> str | None:
        """The JSON schema of vLLM's ``structured_outputs: {"json": ...}`` as compiled text (None: free text);
        400 for any other kind of structured output."""
        if not structured:
            return None
        schema = structured.get("json")
        if set(structured) != {"json"} or not isinstance(schema, dict):
            raise HTTPException(400, "structured_outputs supports only {\"json\": <JSON schema object>}")
        return json.dumps(schema, sort_keys=True)

    def chat(self, req: ChatRequest) -> dict[str, Any]:
        text = self.tok.apply_chat_template(req.messages, tokenize=False, add_generation_prompt=True)
        ids = list(self.tok(text, add_special_tokens=False)["input_ids"])
        fmt = req.response_format or {}
        grammar = None
        if fmt.get("type") == "json_schema":
            schema = (fmt.get("json_schema") or {}).get("schema")
            if not isinstance(schema, dict):
                raise HTTPException(400, "response_format.json_schema.schema must be a JSON schema object")
            grammar = _Grammar(self._compiled(json.dumps(schema, sort_keys=True)))
        elif fmt.get("type") == "json_object":
            grammar = _Grammar(self._compiled(None))
        steps = self._greedy(ids, req.max_tokens, {}, 0, False, grammar)
        tokens = [t for t, _, _ in steps if t != self.tok.eos_token_id]
        done = grammar.done if grammar is not None else bool(steps) and steps[-1][0] == self.tok.eos_token_id
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
                "model": self.name, "choices": [{"index": 0, "finish_reason": "stop" if done else "length",
                                                 "message": {"role": "assistant",
                                                             "content": self.tok.decode(tokens)}}],
                "usage": {"prompt_tokens": len(ids), "completion_tokens": len(steps)}}

    def _compiled(self, schema: str | None) -> Any:
        import xgrammar as xgr  # lazy: imports xgrammar (and torch)

        key = schema or "<json>"
        if key not in self._grammars:
            info = xgr.TokenizerInfo.from_huggingface(self.tok, vocab_size=self.model.config.vocab_size)
            compiler = xgr.GrammarCompiler(info)
            self._grammars[key] = (compiler.compile_json_schema(schema, any_whitespace=False) if schema
                                   else compiler.compile_builtin_json_grammar())
        return self._grammars[key]

    def embed(self, req: EmbeddingRequest) -> dict[str, Any]:
        texts = [req.input] if isinstance(req.input, str) else list(req.input)
        rows = [list(self.tok(t, add_special_tokens=False)["input_ids"]) or [self.pad_id] for t in texts]
        data = []
        with self.lock, torch.inference_mode():
            for i, ids in enumerate(rows):
                hidden = self.model.model(input_ids=torch.tensor([ids])).last_hidden_state[0].float()
                vec = torch.nn.functional.normalize(hidden.mean(0), dim=0)
                data.append({"object": "embedding", "index": i, "embedding": vec.tolist()})
        return {"object": "list", "data": data, "model": self.name,
                "usage": {"prompt_tokens": sum(map(len, rows)), "total_tokens": sum(map(len, rows))}}


class _Grammar:
    """One xgrammar matcher: masks logits to the tokens the schema allows next."""

    def __init__(self, compiled: Any):
        import xgrammar as xgr  # lazy: imports xgrammar (and torch)

        self.xgr = xgr
        self.matcher = xgr.GrammarMatcher(compiled)
        self.bitmask = xgr.allocate_token_bitmask(1, compiled.tokenizer_info.vocab_size)
        self.done = False

    def mask(self, logits: Any) -> Any:
        self.matcher.fill_next_token_bitmask(self.bitmask)
        row = logits.unsqueeze(0).clone()
        self.xgr.apply_token_bitmask_inplace(row, self.bitmask)
        return row[0]

    def accept(self, token: int) -> bool:
        """Feed the chosen token; True once the grammar is complete."""
        self.matcher.accept_token(token)
        self.done = self.matcher.is_terminated()
        return self.done


def create_app(worker: LLMWorker) -> FastAPI:
    app = FastAPI(title="recsys LLM worker (OpenAI-compatible subset)")
    app.add_api_route("/v1/completions", worker.complete, methods=["POST"])
    app.add_api_route("/v1/chat/completions", worker.chat, methods=["POST"])
    app.add_api_route("/v1/embeddings", worker.embed, methods=["POST"])
    app.add_api_route("/v1/models", lambda: {"object": "list", "data": [{"id": worker.name, "object": "model"}]},
                      methods=["GET"])
    app.add_api_route("/health", lambda: {"status": "ok", **worker.batcher.stats()}, methods=["GET"])
    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn  # lazy: only the worker process serves HTTP

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a packaged backbone (llm_rerank.packaged_backbones: smollm2-135m-instruct, "
                    "gemma3-270m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b; converted once under --artifacts/models), "
                    "an HF model directory (a calibrated one for int8) or a hub id")
    ap.add_argument("--artifacts", default="artifacts", help="where packaged backbones are converted (models/)")
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "int8"],
                    help="auto: bf16 where the machine computes it natively, else fp32")
    ap.add_argument("--name", default=None, help="served model name (default: the directory name)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--window-ms", type=float, default=10.0)
    ap.add_argument("--max-batch", type=int, default=8)
    args = ap.parse_args(argv)
    try:
        location = resolve_model(LLMConfig(model=args.model), Path(args.artifacts))
    except (ValueError, FileNotFoundError) as exc:
        ap.exit(2, f"error: {' '.join(str(exc).split())}\n")
    model, tok = load_model(location, args.precision, args.threads)
    name = args.name or args.model.rstrip("/").split("/")[-1]
    worker = LLMWorker(model, tok, name, window_ms=args.window_ms, max_batch=args.max_batch)
    uvicorn.run(create_app(worker), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
