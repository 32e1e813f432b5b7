"""Where the re-ranker's scores come from: one interface over the in-process model and an HTTP server.

``LLMRerankStage`` builds the prompt (``llm_rerank.prompt``) and hands it to a ``ScoringBackend``,
which turns it into one score per candidate, higher is better:

- ``LocalBackend``: the torch model in this process. It owns the ``LogitScorer`` (with the
  whole-prefix LRU ``PrefixCache``, or the two-tier block cache ``llm_rerank.prefix_kv`` that
  replaces it), the optional ``DynamicBatcher`` that merges concurrent requests into shared
  forward passes, and the verbalizer maths from logits (``listwise_from_logits``,
  ``pointwise_from_logits``). Jobs that need the model itself (``bench.llm_backbones``,
  ``bench.llm_stage``) read ``model``, ``pad_id``, ``scorer``, ``blocks`` and ``batcher`` here.
- ``RemoteBackend``: an OpenAI-compatible server (vLLM, or ``serving.llm_worker``) through
  ``llm_rerank.remote.RemoteLLM``; each call's timeout is the smaller of ``http_timeout_s`` and
  what is left of the request's budget.

Both raise ``StageError`` naming the stage once the request deadline has run out (the pipeline
then serves the previous order). ``build_backend`` picks one from ``LLMConfig.backend``.

Importing this module imports no torch: the block cache and the batch callback import it when
they run, so the http backend and the CLI start without it.

Deliberately left out: loading weights and tokenizers (``llm_rerank.backbone``, called by the
stage's ``load``), prompt text (``llm_rerank.prompt``), retries (the deadline and fallback cover them).
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import numpy as np

from llm_rerank.batching import DynamicBatcher
from llm_rerank.config import BatchingConfig, KVCacheConfig, LLMConfig
from llm_rerank.forward import (
    LogitScorer,
    PrefixCache,
    listwise_from_logits,
    pointwise_from_logits,
    row_logits,
)
from llm_rerank.prompt import PromptBuilder, PromptParts
from llm_rerank.remote import RemoteLLM
from recsys.contract import Request, StageError

if TYPE_CHECKING:
    from llm_rerank.prefix_kv import BlockPrefixCache

log = logging.getLogger(__name__)

Scoring = Literal["listwise", "pointwise"]


@runtime_checkable
class ScoringBackend(Protocol):
    """Turns one request's prompt into scores; called by ``LLMRerankStage.score`` once per request,
    possibly from several serving threads at once."""

    def score(self, parts: PromptParts, prompts: PromptBuilder, n: int, request: Request) -> np.ndarray:
        """Scores of the ``n`` candidates of ``parts`` (built by ``prompts``), in prompt order; raises
        ``StageError`` once ``request``'s deadline has passed or the model cannot answer."""
        ...

    def stats(self) -> dict[str, float]:
        """Counters for serving metrics (``LLMRerankStage.cache_stats``); empty when there are none."""
        ...

    def close(self) -> None:
        """Release threads and connections (tests and benchmarks, when done with the stage)."""
        ...


def check_deadline(request: Request, stage: str, when: str = "") -> float:
    """Seconds left of ``request``'s budget; ``StageError`` naming ``stage`` when none is."""
    left = request.remaining_s()
    if left <= 0:
        raise StageError(f"stage {stage!r}: request deadline reached{when} ({left * 1000:.0f} ms left)")
    return left


class LocalBackend:
    """The causal LM in this process: logits from ``scorer`` (or ``batcher``), then the verbalizer maths."""

    def __init__(self, model: Any, pad_id: int, *, scoring: Scoring = "listwise", batch_size: int = 32,
                 prefix_cache_size: int = 0, blocks: BlockPrefixCache | None = None,
                 batching: BatchingConfig | None = None, stage: str = "llm"):
        """``blocks`` (the two-tier block cache), when given, replaces the whole-prefix LRU of
        ``prefix_cache_size`` entries; ``batching`` with ``enabled`` starts the batcher's thread."""
        self.model = model
        self.pad_id = pad_id
        self.scoring: Scoring = scoring
        self.stage = stage
        self.blocks = blocks
        lru = PrefixCache(0 if blocks is not None else prefix_cache_size)  # the block cache replaces it
        self.scorer = LogitScorer(model, pad_id, batch_size=batch_size, cache=lru, blocks=blocks)
        self.batcher: DynamicBatcher | None = None
        if batching is not None and batching.enabled:
            self.batcher = DynamicBatcher(self.run_batch, window_ms=batching.window_ms,
                                          max_batch=batching.max_batch, length_bucket=batching.length_bucket)

    @classmethod
    def from_config(cls, cfg: LLMConfig, model: Any, pad_id: int, *, stage: str = "llm",
                    kv_namespace: str = "", redis_client: Any = None) -> LocalBackend:
        """The backend ``cfg`` describes around a loaded ``model``. ``kv_namespace`` keys the block cache
        (weights digest, prompt version, precision: blocks of another model must never match);
        ``redis_client`` serves its tier 2."""
        blocks = block_cache(model, cfg.kv, kv_namespace, redis_client) if cfg.kv.enabled else None
        return cls(model, pad_id, scoring=cfg.scoring, batch_size=cfg.batch_size,
                   prefix_cache_size=cfg.prefix_cache_size, blocks=blocks, batching=cfg.batching, stage=stage)

    def score(self, parts: PromptParts, prompts: PromptBuilder, n: int, request: Request) -> np.ndarray:
        def check() -> None:  # before the prefix and between batches
            check_deadline(request, self.stage)

        check()
        batcher = self.batcher  # read once: close() may clear it meanwhile (the closed batcher raises StageError)
        if batcher is not None:
            logits = self._batched_logits(batcher, parts, request)
        else:
            logits = self.scorer.logits(parts, check=check)
        if self.scoring == "listwise":
            return listwise_from_logits(logits, prompts.letter_ids, n)
        return pointwise_from_logits(logits, *prompts.yes_no)

    def _batched_logits(self, batcher: DynamicBatcher, parts: PromptParts, request: Request) -> Any:
        rows = [parts.prefix + s for s in parts.suffixes]
        left = request.remaining_s()
        deadline = None if left == float("inf") else request.deadline
        future = batcher.submit(rows, length=max(len(r) for r in rows), deadline=deadline,
                                priority=bool(request.context.get("priority", False)))
        try:
            return future.result(timeout=None if deadline is None else max(left, 0.0))
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise StageError(f"stage {self.stage!r}: request deadline reached while batched") from None

    def run_batch(self, jobs: Sequence[Any]) -> list[Any]:
        """Batcher callback: every job's full rows in one padded forward pass, split back per job."""
        import torch  # lazy: heavy, only with a loaded model

        rows = [r for job in jobs for r in job]
        with torch.inference_mode():
            logits = row_logits(self.model, rows, self.pad_id)
        bounds = np.cumsum([0] + [len(j) for j in jobs])
        return [logits[bounds[i] : bounds[i + 1]] for i in range(len(jobs))]

    def clear_prefix_caches(self) -> None:
        """Forget every prefix computed in this process (the LRU and the block cache's tier 1): a
        benchmark's cold start. Tier 2 (Redis) is shared with other processes and kept."""
        self.scorer.cache.clear()
        if self.blocks is not None:
            self.blocks.cache.clear_tier1()

    def stats(self) -> dict[str, float]:
        """``kv_*`` from the block cache, ``batch_*`` from the batcher (each only when it is on)."""
        out: dict[str, float] = {}
        if self.blocks is not None:
            out.update({f"kv_{k}": v for k, v in self.blocks.stats().items()})
        if self.batcher is not None:
            out.update({f"batch_{k}": v for k, v in self.batcher.stats().items()})
        return out

    def close(self) -> None:
        """Stop the batcher (its queued jobs get ``StageError``); later requests run unbatched."""
        if self.batcher is not None:
            self.batcher.close()
            self.batcher = None


def block_cache(model: Any, kv: KVCacheConfig, namespace: str, redis_client: Any = None) -> BlockPrefixCache:
    """The two-tier block prefix cache of ``model``: tier 2 in ``redis_client`` when ``kv.tier2`` asks for
    it (a client its caller opened, ``cascade.registry.kv_tier2_client``), else tier 1 only."""
    from llm_rerank.prefix_kv import BlockPrefixCache  # lazy: imports torch

    client = redis_client if kv.tier2 else None
    if kv.tier2 and client is None:
        log.warning("LLM KV tier 2 off: no Redis client (set settings.redis_url, REDIS_URL or llm.kv.tier2_url)")
    return BlockPrefixCache.build(model, block_tokens=kv.block_tokens, tier1_bytes=kv.tier1_bytes,
                                  namespace=namespace, redis_client=client, kv_dtype=kv.kv_dtype,
                                  prefix=kv.tier2_prefix, ttl_s=kv.tier2_ttl_s,
                                  max_entries=kv.tier2_max_entries)


class RemoteBackend:
    """An OpenAI-compatible server scoring from next-token log-probabilities (``llm_rerank.remote``)."""

    def __init__(self, remote: RemoteLLM, *, scoring: Scoring = "listwise", timeout_s: float | None = None,
                 stage: str = "llm"):
        """``timeout_s`` bounds each call (default: ``remote``'s own timeout); the request's deadline may
        cut it shorter."""
        self.remote = remote
        self.scoring: Scoring = scoring
        self.timeout_s = remote.timeout_s if timeout_s is None else timeout_s
        self.stage = stage

    @classmethod
    def from_config(cls, cfg: LLMConfig, *, stage: str = "llm", client: Any = None) -> RemoteBackend:
        """The server at ``cfg.base_url``; ``client`` is an ``httpx.Client`` to send through (tests)."""
        remote = RemoteLLM(cfg.base_url, cfg.served_model, cfg.http_timeout_s, client=client)
        return cls(remote, scoring=cfg.scoring, timeout_s=cfg.http_timeout_s, stage=stage)

    def score(self, parts: PromptParts, prompts: PromptBuilder, n: int, request: Request) -> np.ndarray:
        left = check_deadline(request, self.stage, " before the LLM call")
        timeout = min(self.timeout_s, left)
        rows = [parts.prefix + s for s in parts.suffixes]
        if self.scoring == "listwise":
            return self.remote.listwise_scores(rows[0], prompts.letter_ids, n, timeout)
        return self.remote.pointwise_scores(rows, *prompts.yes_no, timeout)

    def stats(self) -> dict[str, float]:
        """None kept here: the server reports its own (vLLM's ``/metrics``, the worker's ``/health``)."""
        return {}

    def close(self) -> None:
        self.remote.close()


def build_backend(cfg: LLMConfig, model: Any = None, pad_id: int = 0, *, stage: str = "llm",
                  kv_namespace: str = "", redis_client: Any = None) -> ScoringBackend:
    """The backend ``cfg.backend`` names: ``http`` talks to ``cfg.base_url`` (``model`` unused), ``local``
    scores with ``model`` (``LocalBackend.from_config``). Called by ``LLMRerankStage.load``."""
    if cfg.backend == "http":
        return RemoteBackend.from_config(cfg, stage=stage)
    if model is None:
        raise ValueError(f"stage {stage!r}: backend 'local' needs a loaded model (got None)")
    return LocalBackend.from_config(cfg, model, pad_id, stage=stage, kv_namespace=kv_namespace,
                                    redis_client=redis_client)
