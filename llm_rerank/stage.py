"""``LLMRerankStage``: the pipeline stage that re-scores the top coarse candidates with an LLM.

Takes the top ``LLMConfig.candidates`` rows in their current (coarse) order, builds the
prompt from the request's recent history titles and user attributes, scores them from
logits (listwise by default, pointwise selectable) and returns those rows sorted by the new
``"llm"`` column; rows beyond that count are dropped (the pipeline's LLM depth is 20 too).

``cascade.registry`` builds it from ``settings.llm`` (``spec.params`` override its keys) plus
the artifacts root (where the base model is looked up) and the Redis URL and socket timeout of
the KV cache's tier 2. ``load`` finds the weights and tokenizer, then builds one
``llm_rerank.backends.ScoringBackend`` from the config (``build_backend``) that turns each
request's prompt into scores: ``LocalBackend`` runs the model in process (``precision``
fp32/bf16/int8, SmoothQuant W8A8 from the calibrated ``int8_dir``; ``kv.enabled``, the two-tier
block prefix cache ``llm_rerank.prefix_kv``; ``batching.enabled``, concurrent requests share
forward passes, ``llm_rerank.batching``), ``RemoteBackend`` asks an OpenAI-compatible server
(``backend: http``: vLLM or ``serving.llm_worker``; ``llm_rerank.remote``). Jobs that need the
in-process model itself reach it through ``local()``.

The prompt's instruction and questions come from a ``llm_rerank.template.PromptTemplate``:
``llm.prompt`` at start-up, then whatever ``set_prompt_template`` installs (``PUT /admin/prompts``
through ``serving.document_reload.PromptApplier``). The swap is one assignment of a new
``PromptBuilder``, so a request in flight finishes on the prompt it started with; the stage
version names the template (``p1`` = built-in, ``p1.<digest>`` otherwise).

It never hangs a request: the backend checks ``request.remaining_s()`` before the prefix, between
batches, while queued for a shared batch and as the HTTP timeout, and raises ``StageError`` once it
runs out; the pipeline then serves the previous (coarse) order as a fallback.

Deliberately left out: fusing the LLM score with the coarse score (``fusion.stage``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
from redis import Redis

from llm_rerank.backbone import load_model, resolve_model, resolve_precision, weights_digest
from llm_rerank.backends import LocalBackend, ScoringBackend, build_backend
from llm_rerank.config import LLMConfig
from llm_rerank.item_text import item_labels
from llm_rerank.meta import read_train_meta
from llm_rerank.prompt import PROMPT_VERSION, PromptBuilder, PromptParts, RequestPrompts, pad_token_id
from llm_rerank.template import DEFAULT, PromptTemplate, parse_prompt_document
from llm_rerank.verbalizer_scores import zscore
from offline.split import Split, prepared_item_noun
from recsys.config import StageSpec
from recsys.contract import Candidates, Request, StageError
from recsys.manifest import verify_directory
from recsys.pipeline import STAGE_SWAP


class LLMRerankStage:
    """Stage ``llm``: reads the coarse order, writes the ``llm`` score column."""

    reads: tuple[str, ...] = ("coarse",)

    def __init__(self, spec: StageSpec | None, config: LLMConfig, *, artifacts_root: Path,
                 redis: Redis | None = None):
        """``config`` is ``settings.llm`` (``spec.params`` override its keys; no ``spec``: a stage named
        "llm" outside a pipeline, for the training and benchmark jobs). ``artifacts_root`` is where
        ``resolve_model`` looks for a downloaded base model; ``redis`` serves tier 2 of the KV cache
        (``cascade.registry.kv_tier2_client``: the serving worker's own client, so both share one
        connection pool); the stage never opens a connection itself."""
        self.name: str = spec.name if spec is not None else "llm"
        self.writes: tuple[str, ...] = (self.name,)
        params = dict(spec.params) if spec is not None else {}
        self.cfg: LLMConfig = config.with_overrides(params)
        self._domain = self.cfg.domain  # None: load() takes the word of the dataset it loads
        self.artifacts_root = Path(artifacts_root)
        self.redis = redis
        self.backend: ScoringBackend | None = None  # built by load(): llm_rerank.backends
        self.prompts: PromptBuilder | None = None
        self.titles: np.ndarray = np.zeros(0, dtype=object)
        self.model_location = ""
        self.residual_beta: float | None = None  # adapted with AdaptConfig.residual: served letters + beta * z
        self.template: PromptTemplate = self.cfg.prompt or DEFAULT
        self._weights = ""  # weights digest of the loaded model
        self.precision: str = self.cfg.precision  # what load() actually loaded ("auto" made concrete)

    # -- loading -----------------------------------------------------------------------
    def load(self, artifact_dir: Any) -> None:
        """Load the adapted model (``<artifact_dir>/llm``) or the base one, and the items' prompt text
        (``llm_rerank.item_text``: titles, or titles with their details)."""
        artifact_dir = Path(artifact_dir)
        adapted = artifact_dir / "llm"
        if self.cfg.precision == "int8":
            location = str(self.cfg.int8_dir or artifact_dir / "llm_w8a8")
        elif self.cfg.use_adapted and (adapted / "config.json").exists():
            location = str(adapted)
        else:
            location = resolve_model(self.cfg, self.artifacts_root)
        read = dict.fromkeys([Path(location), *([adapted] if self.cfg.use_adapted else [])])  # adapted: its meta
        for directory in read:  # weights and adapter files against their digests, before torch parses them
            if directory.is_dir():
                verify_directory(directory)
        split = Split.load(artifact_dir / "split")
        self.cfg = self.cfg.model_copy(update={"domain": prepared_item_noun(artifact_dir, self._domain)})
        titles = item_labels(split.items, self.cfg)
        if self.cfg.use_adapted:
            self.residual_beta = residual_beta(Path(location), adapted)
        self._weights = weights_digest(location)
        if self.cfg.backend == "http":  # the server holds the model; only the tokenizer is needed here
            from transformers import AutoTokenizer  # lazy: heavy, only for the http backend

            model, tokenizer = None, AutoTokenizer.from_pretrained(location)
        else:
            self.precision = resolve_precision(self.cfg.precision)
            model, tokenizer = load_model(location, self.precision, self.cfg.threads)
        # blocks are keyed by token ids, which hold the instruction: KV of equal tokens is equal under
        # any template, so the template is not in the namespace
        backend = build_backend(self.cfg, model, pad_token_id(tokenizer), stage=self.name,
                                kv_namespace=f"{self._weights}-{PROMPT_VERSION}|{self.precision}",
                                redis_client=self.redis)
        self.attach(backend, tokenizer, titles)
        self.model_location = location

    def attach(self, backend: ScoringBackend, tokenizer: Any, titles: np.ndarray) -> None:
        """Serve with ``backend``, prompts from ``tokenizer`` and these item titles (``load`` calls it;
        tests pass a backend they built). A backend attached before is closed."""
        previous, self.backend = self.backend, backend
        if previous is not None and previous is not backend:
            previous.close()
        self.prompts = PromptBuilder.for_config(tokenizer, self.cfg, self.template)
        self.titles = np.asarray(titles, dtype=object)
        self._weights = self._weights or "unversioned"

    def local(self) -> LocalBackend:
        """The in-process model's backend, for jobs that need the model itself (``bench.llm_backbones``,
        ``bench.llm_stage``); ``ValueError`` with ``backend: http``, whose model lives in the server."""
        backend = self._backend()
        if not isinstance(backend, LocalBackend):
            raise ValueError(f"stage {self.name!r}: llm.backend is {self.cfg.backend!r}, whose model runs in "
                             "another process; this needs llm.backend 'local'")
        return backend

    def cache_stats(self) -> dict[str, float]:
        """Prefix cache (``kv_*``) and batching (``batch_*``) counters for serving metrics (empty when
        both are off, and for the http backend)."""
        return self.backend.stats() if self.backend is not None else {}

    def close(self) -> None:
        """Release the backend's batcher thread / HTTP connections (tests and benchmarks)."""
        if self.backend is not None:
            self.backend.close()

    def version(self) -> str:
        if not self._weights:
            return "not-loaded"
        prompt = PROMPT_VERSION if self.template.is_default() else f"{PROMPT_VERSION}.{self.template.digest()}"
        return f"{self._weights}-{prompt}-{self.cfg.scoring}"

    def set_prompt_template(self, template: PromptTemplate | dict[str, Any]) -> None:
        """Serve ``template`` from the next request on (called by ``serving.document_reload.PromptApplier``,
        on its watcher thread or an admin request's, with a document it validated)."""
        template = parse_prompt_document(template, f"stage {self.name!r} prompt")
        prompts = self.prompts.with_template(template) if self.prompts is not None else None  # built first
        with STAGE_SWAP:  # a request pins the stage under it: the old template and builder, or the new ones
            self.prompts = prompts
            self.template = template

    def pinned(self) -> LLMRerankStage:
        """A copy fixed on the template (and its prompt builder) served now, for one request
        (``recsys.pipeline.Pipeline.snapshot``): the answer's prompt version is the one that scored it,
        even when ``PUT /admin/prompts`` lands mid-request. Shallow: the model and caches are shared."""
        return copy.copy(self)

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
        return self._backend().score(parts, prompts, len(item_idx), request)

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

    def _backend(self) -> ScoringBackend:
        if self.backend is None:
            raise StageError(f"stage {self.name!r} used before load()")
        return self.backend


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
