"""Reasons on an answer's top items (``explain: true`` on POST /v1/recommend, ``recsys recommend --explain``).

``Explanations`` is built with the ``Recommender`` (cheap) and assembles on first use what
``llm_rerank.explain.ReasonWriter`` needs:

- the catalog facts (``llm_rerank.grounding.ItemFacts``) from ``<artifact_dir>/split`` (titles only
  when there is no artifact directory);
- the co-visitation matrix recall trained (``<artifact_dir>/recall/channels``), for each item's
  nearest history items;
- the reason cache: the serving layer's Redis (``<namespace>:reason:``) once the recommender is
  online, else an in-process LRU;
- the model: an enabled, loaded LLM stage of the pipeline with the local backend (its prefix
  cache, prompt document and hot swaps are shared), else the configured backbone loaded on a
  background thread when ``explain`` is first asked for (``llm.explain.preload``: at start-up).
  Until a model is ready, or with the ``http`` backend, reasons come from the templates. A prompt
  document published with ``PUT /admin/prompts`` reaches that backbone too (``set_prompt_template``);
  its KV cache tier 2, when configured, uses the server's Redis client (``redis``).

``explain`` sets ``reason`` and ``reason_source`` on the first ``explain_k`` items of an answer.

Deliberately left out: writing and checking reasons (``llm_rerank.explain``).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from redis import Redis

from cascade.registry import kv_tier2_client
from cascade.settings import Settings
from llm_rerank.explain import EvidenceBuilder, ReasonGenerator, ReasonWriter
from llm_rerank.grounding import ItemFacts
from llm_rerank.reason_cache import MemoryReasonCache, RedisReasonCache
from llm_rerank.stage import LLMRerankStage
from offline.loaders import GENERIC_NOUN
from offline.split import Split, prepared_item_noun
from recsys.contract import Candidates, Request
from recsys.pipeline import Pipeline
from serving.catalog_state import CatalogState
from serving.schemas import RecommendResponse

if TYPE_CHECKING:
    from serving.online_state import OnlineState

log = logging.getLogger(__name__)


class Explanations:
    """Reasons for one recommender's answers; one per ``Recommender``, shared by its request threads."""

    def __init__(self, settings: Settings, catalog: CatalogState, pipeline: Pipeline,
                 artifact_dir: Path | None = None, redis: Redis | None = None):
        self.settings, self.catalog, self.pipeline, self.redis = settings, catalog, pipeline, redis
        self.artifact_dir = None if artifact_dir is None else Path(artifact_dir)
        self.cfg = settings.llm.explain
        self._writer: ReasonWriter | None = None
        self._generator: ReasonGenerator | None = None
        self._loading: threading.Thread | None = None
        self._standalone: LLMRerankStage | None = None  # the backbone loaded for reasons alone, if any
        self._template: Any = None  # the prompt document published last (PUT /admin/prompts), for that stage
        self._lock = threading.Lock()
        self.load_error: str | None = None

    # -- assembly ----------------------------------------------------------------------
    def writer(self, online: OnlineState | None = None) -> ReasonWriter:
        """The writer (built once); its cache is Redis when ``online`` is given."""
        with self._lock:
            if self._writer is None:
                llm = self.settings.llm
                self._writer = ReasonWriter(EvidenceBuilder(self._facts(), self._covisit(), self.cfg.neighbours,
                                                            llm.history_items),
                                            self.cfg, self._noun(), self._cache(online), self.generator)
            return self._writer

    def _noun(self) -> str:
        """``llm.domain``, else the word for an item of the dataset served (``offline.split.prepared_item_noun``)."""
        if self.artifact_dir is None:
            return self.settings.llm.domain or GENERIC_NOUN
        return prepared_item_noun(self.artifact_dir, self.settings.llm.domain)

    def _facts(self) -> ItemFacts:
        split = self.artifact_dir / "split" if self.artifact_dir is not None else None
        if split is not None and split.is_dir():
            return ItemFacts.from_items(Split.load(split).items)
        titles = [str(t) for t in self.catalog.titles]
        return ItemFacts(titles, [[] for _ in titles], [None] * len(titles), [""] * len(titles))

    def _covisit(self) -> Any:
        recall_dir = self.artifact_dir / "recall" if self.artifact_dir is not None else None
        if recall_dir is None or not (recall_dir / "channels.json").is_file():
            return None
        from recall.model import load_channels  # lazy: imports scipy and the recall model

        try:
            channels, _ = load_channels(recall_dir, self.settings.recall)
        except (OSError, ValueError, KeyError) as exc:
            log.warning("reasons without co-visitation neighbours: %s", exc)
            return None
        return next((c.weights for c in channels if c.name == "covisit"), None)

    def _cache(self, online: OnlineState | None) -> Any:
        if online is not None:
            return RedisReasonCache(online.client, online.ns, self.cfg.cache_ttl_s, online.guard)
        return MemoryReasonCache(self.cfg.cache_size, self.cfg.cache_ttl_s)

    # -- the model ---------------------------------------------------------------------
    def use(self, generator: ReasonGenerator | None) -> None:
        """Write reasons with ``generator`` from now on (None: templates only)."""
        self._generator = generator

    def generator(self) -> ReasonGenerator | None:
        """The model that writes reasons, or None while there is none (then templates are served)."""
        if self._generator is not None:
            return self._generator
        stage = self._pipeline_stage()
        if stage is not None:
            self._generator = self._wrap(stage)
            return self._generator
        if self.cfg.model == "auto":
            self.start_loading()
        return None

    def backbone(self) -> str | None:
        """Where the model writing reasons was loaded from (None: templates only so far)."""
        gen = self._generator
        return None if gen is None else str(gen.stage.model_location or self.settings.llm.model)

    def _pipeline_stage(self) -> LLMRerankStage | None:
        for spec, stage in self.pipeline.stages:
            if spec.kind == "llm" and spec.enabled and isinstance(stage, LLMRerankStage) and stage.prompts is not None:
                return stage
        return None

    def _wrap(self, stage: LLMRerankStage) -> ReasonGenerator | None:
        try:
            return ReasonGenerator(stage, self.cfg, self._noun())
        except (ValueError, ImportError) as exc:  # no model in reach, or no grammar engine: templates
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.warning("reasons from templates only: %s", self.load_error)
            return None

    def start_loading(self, wait: bool = False) -> None:
        """Load the configured backbone for reasons on a background thread (once); ``wait``: block until done."""
        with self._lock:
            if (self._loading is None and self._generator is None and self.artifact_dir is not None
                    and self.load_error is None):
                self._loading = threading.Thread(target=self._load, name="explain-model-load", daemon=True)
                self._loading.start()
            thread = self._loading
        if wait and thread is not None:
            thread.join()

    def _load(self) -> None:
        try:
            stage = LLMRerankStage(None, self.settings.llm, artifacts_root=self.settings.artifacts_dir,
                                   redis=kv_tier2_client(self.settings, self.redis))
            stage.load(self.artifact_dir)
        except Exception as exc:  # noqa: BLE001 (a model that fails to load leaves templates, never a crash)
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.error("the explanation model did not load; reasons come from templates: %s", self.load_error)
            return
        with self._lock:
            self._standalone = stage
            if self._template is not None:
                stage.set_prompt_template(self._template)
        self._generator = self._wrap(stage)

    def set_prompt_template(self, template: Any) -> None:
        """A published prompt document (``serving.document_reload.PromptApplier``, which also installs it in the
        pipeline's LLM stages): the backbone loaded for reasons alone serves it too, now or once loaded."""
        with self._lock:
            self._template = template
            if self._standalone is not None:
                self._standalone.set_prompt_template(template)

    # -- serving -----------------------------------------------------------------------
    def explain(self, request: Request, candidates: Candidates, answer: RecommendResponse, explain_k: int | None,
                online: OnlineState | None = None) -> RecommendResponse:
        """``answer`` with ``reason`` and ``reason_source`` on its first ``explain_k`` items (default
        ``llm.explain.explain_k``, at most the list)."""
        k = min(explain_k or self.cfg.explain_k, len(answer.items), len(candidates))
        if k == 0:
            return answer
        channels = [[name.removeprefix("src_") for name, col in candidates.flags.items()
                     if name.startswith("src_") and bool(col[row])] for row in range(k)]
        reasons = self.writer(online).write(request, [int(i) for i in candidates.items[:k]], channels)
        items = [item.model_copy(update={"reason": r.text, "reason_source": r.source})
                 for item, r in zip(answer.items, reasons, strict=False)] + list(answer.items[k:])
        return answer.model_copy(update={"items": items})
