"""``LLMRerankStage``: the pipeline stage that re-scores the top coarse candidates with an LLM.

Takes the top ``LLMConfig.candidates`` rows in their current (coarse) order, builds the
prompt from the request's recent history titles and user attributes, scores them from
logits (listwise by default, pointwise selectable) and returns those rows sorted by the new
``"llm"`` column; rows beyond that count are dropped (the pipeline's LLM depth is 20 too).

``cascade.registry`` builds it from ``settings.llm`` (``spec.params`` override its keys) plus
the artifacts root (where the base model is looked up) and the Redis URL and socket timeout of
the KV cache's tier 2. Serving options (``LLMConfig``): ``precision`` fp32/bf16/int8
(SmoothQuant W8A8 from the calibrated ``int8_dir``), ``kv.enabled`` (two-tier block prefix
cache, ``llm_rerank.prefix_kv``), ``batching.enabled`` (concurrent requests share forward
passes, ``llm_rerank.batching``) and ``backend: http`` (an OpenAI-compatible server: vLLM or
``serving.llm_worker``; ``llm_rerank.remote``).

The prompt's instruction and questions come from a ``llm_rerank.template.PromptTemplate``:
``llm.prompt`` at start-up, then whatever ``set_prompt_template`` installs (``PUT /admin/prompts``
through ``serving.hot_reload.PromptApplier``). The swap is one assignment of a new
``PromptBuilder``, so a request in flight finishes on the prompt it started with; the stage
version names the template (``p1`` = built-in, ``p1.<digest>`` otherwise).

It never hangs a request: ``request.remaining_s()`` is checked before the prefix and
between batches and a ``StageError`` is raised once it runs out; the pipeline then serves
the previous (coarse) order as a fallback.

Deliberately left out: fusing the LLM score with the coarse score (``fusion.stage``).
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from llm_rerank.backbone import load_model, resolve_model, resolve_precision, weights_digest
from llm_rerank.batching import DynamicBatcher
from llm_rerank.config import LLMConfig
from llm_rerank.meta import read_train_meta
from llm_rerank.prompt import PROMPT_VERSION, PromptBuilder, PromptParts, RequestPrompts, pad_token_id
from llm_rerank.remote import RemoteLLM
from llm_rerank.scores import zscore
from llm_rerank.scoring import (
    LogitScorer,
    PrefixCache,
    listwise_from_logits,
    pointwise_from_logits,
    row_logits,
)
from llm_rerank.template import DEFAULT, PromptTemplate, parse_prompt_document
from offline.split import Split
from recsys.config import StageSpec
from recsys.contract import Candidates, Request, StageError
from recsys.redis_state import DEFAULT_SOCKET_TIMEOUT_S, connect

log = logging.getLogger(__name__)


class LLMRerankStage:
    """Stage ``llm``: reads the coarse order, writes the ``llm`` score column."""

    reads: tuple[str, ...] = ("coarse",)

    def __init__(self, spec: StageSpec | None, config: LLMConfig, *, artifacts_root: Path,
                 redis_url: str | None = None, redis_socket_timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S):
        """``config`` is ``settings.llm`` (``spec.params`` override its keys; no ``spec``: a stage named
        "llm" outside a pipeline, for the training and benchmark jobs). ``artifacts_root`` is where
        ``resolve_model`` looks for a downloaded base model; ``redis_url`` (``Settings.resolve_redis_url``)
        and ``redis_socket_timeout_s`` serve tier 2 of the KV cache unless ``kv.tier2_url`` is set."""
        self.name: str = spec.name if spec is not None else "llm"
        self.writes: tuple[str, ...] = (self.name,)
        params = dict(spec.params) if spec is not None else {}
        self.cfg: LLMConfig = config.with_overrides(params)
        self.artifacts_root = Path(artifacts_root)
        self.redis_url = redis_url
        self.redis_socket_timeout_s = redis_socket_timeout_s
        self.blocks: Any = None
        self.batcher: Any = None
        self.remote: Any = None
        self.model: Any = None
        self.prompts: PromptBuilder | None = None
        self.scorer: Any = None
        self.titles: np.ndarray = np.zeros(0, dtype=object)
        self.model_location = ""
        self.residual_beta: float | None = None  # adapted with AdaptConfig.residual: served letters + beta * z
        self.template: PromptTemplate = self.cfg.prompt or DEFAULT
        self._weights = ""  # weights digest of the loaded model
        self.precision: str = self.cfg.precision  # what load() actually loaded ("auto" made concrete)

    # -- loading -----------------------------------------------------------------------
    def load(self, artifact_dir: Any) -> None:
        """Load the adapted model (``<artifact_dir>/llm``) or the base one, and item titles."""
        artifact_dir = Path(artifact_dir)
        adapted = artifact_dir / "llm"
        if self.cfg.precision == "int8":
            location = str(self.cfg.int8_dir or artifact_dir / "llm_w8a8")
        elif self.cfg.use_adapted and (adapted / "config.json").exists():
            location = str(adapted)
        else:
            location = resolve_model(self.cfg, self.artifacts_root)
        split = Split.load(artifact_dir / "split")
        titles = split.items["title"].to_numpy(dtype=object)
        if self.cfg.use_adapted:
            self.residual_beta = residual_beta(Path(location), adapted)
        self._weights = weights_digest(location)
        if self.cfg.backend == "http":  # the server holds the model; only the tokenizer is needed here
            from transformers import AutoTokenizer  # lazy: heavy, only for the http backend

            self.remote = RemoteLLM(self.cfg.base_url, self.cfg.served_model, self.cfg.http_timeout_s)
            self.attach(None, AutoTokenizer.from_pretrained(location), titles)
        else:
            self.precision = resolve_precision(self.cfg.precision)
            model, tokenizer = load_model(location, self.precision, self.cfg.threads)
            self.attach(model, tokenizer, titles)
        self.model_location = location

    def attach(self, model: Any, tokenizer: Any, titles: np.ndarray) -> None:
        """Use an already loaded model/tokenizer and item titles (the training job and tests)."""
        self.model = model
        self.prompts = PromptBuilder.for_config(tokenizer, self.cfg, self.template)
        self.titles = np.asarray(titles, dtype=object)
        self._weights = self._weights or "unversioned"
        blocks = self._block_cache(model) if model is not None and self.cfg.kv.enabled else None
        if blocks is not None:
            self.blocks = blocks
        # the block cache, when on, replaces the whole-prefix LRU
        lru = PrefixCache(0 if blocks is not None else self.cfg.prefix_cache_size)
        self.scorer = LogitScorer(model, pad_token_id(tokenizer), batch_size=self.cfg.batch_size, cache=lru,
                                  blocks=blocks)
        if model is not None and self.cfg.batching.enabled:
            b = self.cfg.batching
            self.batcher = DynamicBatcher(self._run_batch, window_ms=b.window_ms, max_batch=b.max_batch,
                                          length_bucket=b.length_bucket)

    def _block_cache(self, model: Any) -> Any:
        from llm_rerank.prefix_kv import BlockPrefixCache  # lazy: imports torch

        kv = self.cfg.kv
        client = None
        if kv.tier2:
            try:
                client = connect(kv.tier2_url or self.redis_url, self.redis_socket_timeout_s)
            except ValueError as exc:
                log.warning("LLM KV tier 2 off: %s", exc)
        return BlockPrefixCache.build(model, block_tokens=kv.block_tokens, tier1_bytes=kv.tier1_bytes,
                                      # blocks are keyed by token ids, which hold the instruction: KV of
                                      # equal tokens is equal under any template, so it is not in the key
                                      namespace=f"{self._weights}-{PROMPT_VERSION}|{self.precision}",
                                      redis_client=client,
                                      kv_dtype=kv.kv_dtype, prefix=kv.tier2_prefix, ttl_s=kv.tier2_ttl_s,
                                      max_entries=kv.tier2_max_entries)

    def _run_batch(self, jobs: Sequence[Any]) -> list[Any]:
        """Batcher callback: every job's full rows in one padded forward pass, split back per job."""
        import torch  # lazy: heavy, only with a loaded model

        rows = [r for job in jobs for r in job]
        with torch.inference_mode():
            logits = row_logits(self.model, rows, self.scorer.pad_id)
        bounds = np.cumsum([0] + [len(j) for j in jobs])
        return [logits[bounds[i] : bounds[i + 1]] for i in range(len(jobs))]

    def cache_stats(self) -> dict[str, float]:
        """Prefix cache and batching counters for serving metrics (empty when both are off)."""
        out: dict[str, float] = {}
        if self.blocks is not None:
            out.update({f"kv_{k}": v for k, v in self.blocks.stats().items()})
        if self.batcher is not None:
            out.update({f"batch_{k}": v for k, v in self.batcher.stats().items()})
        return out

    def close(self) -> None:
        if self.batcher is not None:
            self.batcher.close()
            self.batcher = None

    def version(self) -> str:
        if not self._weights:
            return "not-loaded"
        prompt = PROMPT_VERSION if self.template.is_default() else f"{PROMPT_VERSION}.{self.template.digest()}"
        return f"{self._weights}-{prompt}-{self.cfg.scoring}"

    def set_prompt_template(self, template: PromptTemplate | dict[str, Any]) -> None:
        """Serve ``template`` from the next request on (called by ``serving.hot_reload.PromptApplier``,
        on its watcher thread or an admin request's, with a document it validated)."""
        template = parse_prompt_document(template, f"stage {self.name!r} prompt")
        if self.prompts is not None:
            self.prompts = self.prompts.with_template(template)  # built first, then one assignment
        self.template = template

    # -- serving -----------------------------------------------------------------------
    def build_prompt(self, request: Request, item_idx: np.ndarray,
                     prompts: PromptBuilder | None = None) -> PromptParts:
        """The prompt of ``request`` over ``item_idx`` (``RequestPrompts``), with ``prompts`` (the builder
        of the template this request started on) or the current one."""
        return RequestPrompts.for_config(prompts or self._prompts(), self.titles, self.cfg).build(request, item_idx)

    def score(self, request: Request, item_idx: np.ndarray) -> np.ndarray:
        """LLM scores for ``item_idx`` in that order (higher is better)."""
        if len(item_idx) == 0:
            return np.zeros(0, dtype=np.float32)
        prompts = self._prompts()  # one builder for the whole request, even if a new template lands meanwhile
        parts = self.build_prompt(request, item_idx, prompts)

        def check() -> None:
            left = request.remaining_s()
            if left <= 0:
                raise StageError(f"stage {self.name!r}: request deadline reached ({left * 1000:.0f} ms left)")

        if self.remote is not None:
            return self._score_remote(parts, len(item_idx), request, prompts)
        if self.batcher is not None:
            logits = self._batched_logits(parts, request)
        else:
            logits = self.scorer.logits(parts, check=check)
        if self.cfg.scoring == "listwise":
            return listwise_from_logits(logits, prompts.letter_ids, len(item_idx))
        return pointwise_from_logits(logits, *prompts.yes_no)

    def _batched_logits(self, parts: PromptParts, request: Request) -> Any:
        rows = [parts.prefix + s for s in parts.suffixes]
        left = request.remaining_s()
        deadline = None if left == float("inf") else request.deadline
        future = self.batcher.submit(rows, length=max(len(r) for r in rows), deadline=deadline,
                                     priority=bool(request.context.get("priority", False)))
        try:
            return future.result(timeout=None if deadline is None else max(left, 0.0))
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise StageError(f"stage {self.name!r}: request deadline reached while batched") from None

    def _score_remote(self, parts: PromptParts, n: int, request: Request, prompts: PromptBuilder) -> np.ndarray:
        left = request.remaining_s()
        if left <= 0:
            raise StageError(f"stage {self.name!r}: request deadline reached before the LLM call")
        timeout = min(self.cfg.http_timeout_s, left)
        rows = [parts.prefix + s for s in parts.suffixes]
        if self.cfg.scoring == "listwise":
            return self.remote.listwise_scores(rows[0], prompts.letter_ids, n, timeout)
        return self.remote.pointwise_scores(rows, *prompts.yes_no, timeout)

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        top = candidates.head(self.cfg.candidates)
        scores = self.score(request, top.items)
        if self.residual_beta is not None and top.order_by in top.scores:
            scores = scores + self.residual_beta * zscore(top.scores[top.order_by])
        return top.with_scores(self.name, scores)

    def _prompts(self) -> PromptBuilder:
        if self.prompts is None:
            raise StageError(f"stage {self.name!r} used before load()")
        return self.prompts


def residual_beta(*locations: Path) -> float | None:
    """The residual weight of the first of ``locations`` with an adaptation report.

    A model adapted with ``llm.adapt.residual`` learnt its letter logits as a correction of the
    incoming order, so it is served as ``letters + beta * z(incoming score)``; ``None`` = plain.
    """
    for loc in locations:
        meta = read_train_meta(loc)
        if meta is not None:
            value = meta.get("residual_beta")
            return None if value is None else float(value)
    return None
