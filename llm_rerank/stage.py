"""``LLMRerankStage``: the pipeline stage that re-scores the top coarse candidates with an LLM.

Takes the top ``settings.llm.candidates`` rows in their current (coarse) order, builds the
prompt from the request's recent history titles and user attributes, scores them from
logits (listwise by default, pointwise selectable) and returns those rows sorted by the new
``"llm"`` column; rows beyond that count are dropped (the pipeline's LLM depth is 20 too).

It never hangs a request: ``request.remaining_s()`` is checked before the prefix and
between batches and a ``StageError`` is raised once it runs out; the pipeline then serves
the previous (coarse) order as a fallback.

Deliberately left out: fusing the LLM score with the coarse score (``recsys.fusion``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from llm_rerank.config import LLMConfig
from llm_rerank.prompt import PROMPT_VERSION, PromptBuilder, PromptParts
from recsys.contract import Candidates, Request, StageError

log = logging.getLogger(__name__)


class LLMRerankStage:
    """Stage ``llm``: reads the coarse order, writes the ``llm`` score column."""

    reads: tuple[str, ...] = ("coarse",)

    def __init__(self, spec: Any, settings: Any):
        self.name: str = spec.name if spec is not None else "llm"
        self.writes: tuple[str, ...] = (self.name,)
        params = dict(spec.params) if spec is not None else {}
        self.cfg: LLMConfig = settings.llm.with_overrides(params)
        self.artifacts_root = Path(settings.artifacts_dir)
        self.model: Any = None
        self.prompts: PromptBuilder | None = None
        self.scorer: Any = None
        self.titles: np.ndarray = np.zeros(0, dtype=object)
        self.model_location = ""
        self._version = ""

    # -- loading -----------------------------------------------------------------------
    def load(self, artifact_dir: Any) -> None:
        """Load the adapted model (``<artifact_dir>/llm``) or the base one, and item titles."""
        from llm_rerank.backbone import load_model, resolve_model, weights_digest
        from offline.split import Split

        artifact_dir = Path(artifact_dir)
        adapted = artifact_dir / "llm"
        if self.cfg.use_adapted and (adapted / "config.json").exists():
            location = str(adapted)
        else:
            location = resolve_model(self.cfg, self.artifacts_root)
        model, tokenizer = load_model(location, self.cfg.precision, self.cfg.threads)
        split = Split.load(artifact_dir / "split")
        self.attach(model, tokenizer, split.items["title"].to_numpy(dtype=object))
        self.model_location = location
        self._version = f"{weights_digest(location)}-{PROMPT_VERSION}-{self.cfg.scoring}"

    def attach(self, model: Any, tokenizer: Any, titles: np.ndarray) -> None:
        """Use an already loaded model/tokenizer and item titles (the training job and tests)."""
        from llm_rerank.scoring import LogitScorer, PrefixCache

        self.model = model
        self.prompts = PromptBuilder(tokenizer, domain=self.cfg.domain, title_chars=self.cfg.title_chars)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.scorer = LogitScorer(model, int(pad or 0), batch_size=self.cfg.batch_size,
                                  cache=PrefixCache(self.cfg.prefix_cache_size))
        self.titles = np.asarray(titles, dtype=object)
        if not self._version:
            self._version = f"unversioned-{PROMPT_VERSION}-{self.cfg.scoring}"

    def version(self) -> str:
        return self._version or "not-loaded"

    # -- serving -----------------------------------------------------------------------
    def build_prompt(self, request: Request, item_idx: np.ndarray) -> PromptParts:
        prompts = self._prompts()
        n_hist = self.cfg.history_items
        recent = request.history[-n_hist:] if n_hist > 0 else request.history[:0]
        hist = [self._title(int(i)) for i in recent]
        cands = [self._title(int(i)) for i in item_idx]
        build = prompts.listwise if self.cfg.scoring == "listwise" else prompts.pointwise
        return build(hist, request.user_attrs, cands)

    def score(self, request: Request, item_idx: np.ndarray) -> np.ndarray:
        """LLM scores for ``item_idx`` in that order (higher is better)."""
        from llm_rerank.scoring import listwise_from_logits, pointwise_from_logits

        if len(item_idx) == 0:
            return np.zeros(0, dtype=np.float32)
        parts = self.build_prompt(request, item_idx)

        def check() -> None:
            left = request.remaining_s()
            if left <= 0:
                raise StageError(f"stage {self.name!r}: request deadline reached ({left * 1000:.0f} ms left)")

        logits = self.scorer.logits(parts, check=check)
        if self.cfg.scoring == "listwise":
            return listwise_from_logits(logits, self._prompts().letter_ids, len(item_idx))
        return pointwise_from_logits(logits, *self._prompts().yes_no)

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        top = candidates.head(self.cfg.candidates)
        scores = self.score(request, top.items)
        return top.with_scores(self.name, scores)

    def _prompts(self) -> PromptBuilder:
        if self.prompts is None:
            raise StageError(f"stage {self.name!r} used before load()")
        return self.prompts

    def _title(self, item_idx: int) -> str:
        if not 0 <= item_idx < len(self.titles):
            raise StageError(f"item_idx {item_idx} outside the catalog of {len(self.titles)} titles")
        return str(self.titles[item_idx])
