"""Reasons for recommended items, written by the LLM from evidence, checked, cached, within a budget.

For each of a request's top items ``ReasonWriter.write`` returns one ``Reason``:

1. **evidence** (``EvidenceBuilder``): the item's title, categories, year and text, the recall
   channels that found it, its nearest history items by co-visitation (the trained
   ``offline.item_neighbours.covisitation`` matrix), the user's history;
2. **cache**: a reason already written for (history digest, item, prompt version) is served as is
   (``llm_rerank.reason_cache``);
3. **generation** (``ReasonGenerator``): one batched, schema-constrained greedy decode for all the
   items not cached, one row per item. Each row offers the model a few numbered *anchors* (the
   history items nearest the item by co-visitation, then the most recent ones: ``anchors_of``) and
   writes ``{"because": <anchor number>, "why": "<lowercase clause>"}`` (``llm_rerank.anchored``,
   through xgrammar: ``llm_rerank.reason_decoding``); the served reason is "Because you <verb> <anchor>, <why>."
   The clause admits no capital letter past its first and no digit, so the model cannot name a
   title or a year: every name in a reason is an anchor's, taken from the evidence, and the model
   chooses which one and says why. Every row continues the re-ranker's own prefix (instruction,
   profile, history window: ``PromptBuilder.prefix``), so the prefix's keys/values come from the
   re-ranker's prefix cache and are computed once per user for both;
4. **check** (``llm_rerank.grounding.ItemFacts.check``): a reason resting on an anchor the row did
   not offer, naming a title outside the history, a category or year the data does not carry, or
   too long, is replaced by the template
   reason from the same evidence, as is every reason when generation errors or runs past its
   budget (``ExplainConfig.budget_ms``, within the request's deadline). ``source`` says which.

The prompt version of a cached reason is the stage's version (weights, re-ranker prompt) plus the
digest of the explanation texts of the prompt document, so a publish through ``PUT /admin/prompts``
or new weights never serve a reason written under the old ones.

With the ``http`` backend the same rows go to the server in one ``/v1/completions`` call with the
schema as structured output (``llm_rerank.reason_decoding``); the server's prefix caching shares
the user's prefix with the re-ranker's request.

Deliberately left out: HTTP and where reasons go in the answer (``serving.explaining``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from llm_rerank.anchored import (
    anchors_of,
    clause_chars,
    clause_problems,
    parse_reason,
    reason_schema,
    render_reason,
)
from llm_rerank.backends import RemoteBackend
from llm_rerank.config import ExplainConfig
from llm_rerank.grounding import Evidence, ItemFacts, display_title, template_reason, verb_for
from llm_rerank.prompt import PromptBuilder
from llm_rerank.reason_cache import ReasonCache
from llm_rerank.reason_decoding import LocalReasonDecoder, ReasonDecoder, RemoteReasonDecoder, check_deadline
from llm_rerank.template import CLOSE, OPEN
from recsys.contract import Request, StageError

log = logging.getLogger(__name__)

ReasonSource = Literal["llm", "template"]
CHANNEL_WORDS = {"covisit": "often {verb} together with your history", "two_tower": "close to your taste overall",
                 "item_model": "similar to items in your history", "popularity": "popular with other visitors",
                 "text": "its text resembles your history", "llm_embedding": "its description resembles your history"}


@dataclass(frozen=True)
class Reason:
    """One item's served reason and how it came to be."""

    text: str
    source: ReasonSource
    cached: bool = False
    schema_valid: bool | None = None  # the model's output parsed against the schema (None: no output)
    problems: tuple[str, ...] = ()  # why the model's reason was not served


@dataclass(frozen=True)
class EvidenceBuilder:
    """Evidence per item from the catalog facts and the co-visitation matrix (None: no neighbours)."""

    facts: ItemFacts
    covisit: Any = None  # scipy CSR [n_items, n_items]: how often column was visited near row
    neighbours: int = 2
    history_items: int = 10

    def build(self, request: Request, items: Sequence[int], channels: Sequence[Sequence[str]]) -> list[Evidence]:
        history = tuple(int(i) for i in request.history if 0 <= int(i) < len(self.facts))
        recent = history[-self.history_items:] if self.history_items > 0 else ()
        out = []
        for item, chans in zip(items, channels, strict=True):
            i = int(item)
            out.append(Evidence(item=i, title=self.facts.titles[i], categories=self.facts.categories[i],
                                year=self.facts.years[i], text=self.facts.texts[i], channels=tuple(chans),
                                neighbours=self.nearest(history, i), history=history, recent=recent))
        return out

    def nearest(self, history: tuple[int, ...], item: int) -> tuple[int, ...]:
        """History items with the largest co-visitation weight towards ``item`` (either direction)."""
        if self.covisit is None or not history or self.neighbours == 0 or item >= self.covisit.shape[0]:
            return ()
        hist = np.unique(np.asarray([h for h in history if h < self.covisit.shape[0]], dtype=np.int64))
        weight = (np.asarray(self.covisit[hist, item].todense()).ravel()
                  + np.asarray(self.covisit[item, hist].todense()).ravel())
        order = np.lexsort((hist, -weight))
        return tuple(int(hist[j]) for j in order[: self.neighbours] if weight[j] > 0)


def history_digest(history: Sequence[int] | np.ndarray, window: int) -> str:
    """16 hex digits over the history window a prompt shows (the reason's input beside the item)."""
    recent = [int(i) for i in history][-window:] if window > 0 else []
    return hashlib.sha256(json.dumps(recent).encode()).hexdigest()[:16]


class ReasonGenerator:
    """Writes reasons with the re-ranker's model, prompt builder and prefix cache.

    ``stage`` is a loaded ``llm_rerank.stage.LLMRerankStage``; its current ``prompts`` (hot-swapped with
    the prompt document) build every row. With the local backend the rows are decoded in process over
    the re-ranker's prefix cache; with the ``http`` backend on its server (``llm_rerank.reason_decoding``).
    """

    def __init__(self, stage: Any, cfg: ExplainConfig, domain: str):
        self.stage, self.cfg, self.domain, self.verb = stage, cfg, domain, cfg.verb or verb_for(domain)
        self.max_chars = clause_chars(cfg)
        self._words: frozenset[str] | None = None
        self.decoder = self._decoder(stage, cfg)

    @staticmethod
    def _decoder(stage: Any, cfg: ExplainConfig) -> ReasonDecoder:
        if isinstance(stage.backend, RemoteBackend):
            return RemoteReasonDecoder(stage.backend.remote, cfg.max_new_tokens)
        backend = stage.local()
        decoder = LocalReasonDecoder(backend.model, stage.prompts.tok, backend.pad_id, backend.scorer,
                                     cfg.max_new_tokens, stage.prompts.ids('"}'))
        decoder.grammar(reason_schema(cfg.anchors, clause_chars(cfg)))  # compiled at load, not on a request
        return decoder

    def words(self) -> frozenset[str]:
        """Words a clause may use: the tokenizer's alphabetic tokens as whole words, and every word of the
        catalog's titles (brands, product names); computed once."""
        if self._words is None:
            vocab = self.stage.prompts.tok.get_vocab()
            tokens = {t.lstrip("Ġ▁ ").lower() for t in vocab}
            catalog = {w for title in self.stage.titles for w in re.findall(r"[a-z]+", str(title).lower())}
            self._words = frozenset(w for w in tokens | catalog if w.isalpha())
        return self._words

    def ask(self) -> str:
        """The explanation request as the prompt words it (what a clause must not merely echo)."""
        return str(self.stage.prompts.template.render("explain_request", self.domain))

    def version(self) -> str:
        """The prompt version of what this writes: model, re-ranker prompt and explanation texts."""
        return f"{self.stage.version()}.e{self.stage.template.explain_digest()}"

    def rows(self, request: Request, evidence: Sequence[Evidence]) -> tuple[list[int], list[list[int]]]:
        """(the re-ranker's prefix for ``request``, one suffix per item asking for its reason)."""
        builder: PromptBuilder = self.stage.prompts
        titles = [self.stage.titles[i] for i in evidence[0].recent] if evidence else []
        prefix = builder.prefix(titles, request.user_attrs)
        return prefix, [self._suffix(builder, ev) for ev in evidence]

    def _suffix(self, b: PromptBuilder, ev: Evidence) -> list[int]:
        def quoted(text: str, chars: int) -> list[int]:
            return b.ids(OPEN) + b.data_ids(text, chars) + b.ids(CLOSE)

        ask = b.template.render("explain_request", self.domain)
        out = b.ids(f"The recommended {self.domain}: ") + quoted(ev.title, b.title_chars) + b.ids("\n")
        facts = [c for c in ev.categories if c][:4]
        if facts:
            out += b.ids("Its categories: ") + quoted(", ".join(facts), 120) + b.ids("\n")
        if ev.year is not None:
            out += b.ids(f"Its year: {ev.year}\n")
        if ev.text and self.cfg.text_chars > 0:
            out += b.ids("About it: ") + quoted(ev.text, self.cfg.text_chars) + b.ids("\n")
        why = [CHANNEL_WORDS[c].format(verb=self.verb) for c in ev.channels if c in CHANNEL_WORDS]
        if why:
            out += b.ids(f"Why it was picked: {'; '.join(why)}.\n")
        out += b.ids(f"Their {self.domain}s to choose from:\n")
        for n, i in enumerate(anchors_of(ev, self.cfg.anchors), start=1):
            out += b.ids(f"{n}. ") + quoted(self.stage.titles[i], b.title_chars) + b.ids("\n")
        return out + b.ids(ask + b.tail.removesuffix("Answer:"))

    def generate(self, request: Request, evidence: Sequence[Evidence], deadline: float) -> list[str]:
        """One JSON text per item, decoded greedily in one batch; ``StageError`` past ``deadline``
        (``time.monotonic()``)."""
        check_deadline(deadline)
        counts = [len(anchors_of(ev, self.cfg.anchors)) for ev in evidence]
        if not all(counts):
            raise StageError("no history item to rest a reason on")
        prefix, suffixes = self.rows(request, evidence)
        return self.decoder.decode(prefix, suffixes, [reason_schema(n, self.max_chars) for n in counts], deadline)


@dataclass
class ReasonWriter:
    """Reasons for a request's items: cache, one generation, the check, templates (module docstring)."""

    evidence: EvidenceBuilder
    cfg: ExplainConfig
    domain: str
    cache: ReasonCache | None = None
    generator: Callable[[], ReasonGenerator | None] = field(default=lambda: None)  # None: templates only
    counts: Counter[str] = field(default_factory=Counter)  # served, cached, generated, schema_valid, grounded, llm

    def _count(self, reasons: Sequence[Reason]) -> None:
        with self._lock:
            self.counts["served"] += len(reasons)
            self.counts["cached"] += sum(r.cached for r in reasons)
            fresh = [r for r in reasons if not r.cached and r.schema_valid is not None]
            self.counts["generated"] += len(fresh)
            self.counts["schema_valid"] += sum(bool(r.schema_valid) for r in fresh)
            self.counts["grounded"] += sum(r.source == "llm" for r in fresh)
            self.counts["llm"] += sum(r.source == "llm" for r in reasons)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def write(self, request: Request, items: Sequence[int], channels: Sequence[Sequence[str]],
              budget_s: float | None = None) -> list[Reason]:
        """One reason per item of ``items``; never later than ``budget_s`` (default the config's) or the
        request's deadline."""
        budget = self.cfg.budget_ms / 1000 if budget_s is None else budget_s
        deadline = time.monotonic() + max(0.0, min(budget, request.remaining_s()))
        evidence = self.evidence.build(request, items, channels)
        gen = self.generator()
        version = gen.version() if gen is not None else "template"
        digest = history_digest(request.history, self.evidence.history_items)
        keys = [f"{version}|{digest}|{ev.item}" for ev in evidence]
        cached = self.cache.get_many(keys) if self.cache is not None and gen is not None else [None] * len(keys)
        out: list[Reason | None] = [None if c is None else Reason(c["text"], c["source"], cached=True,
                                                                  schema_valid=c.get("schema_valid"))
                                    for c in cached]
        todo = [i for i, r in enumerate(out) if r is None]
        texts: list[str] | None = None
        if todo and gen is not None and budget > 0:
            try:
                texts = gen.generate(request, [evidence[i] for i in todo], deadline)
            except StageError as exc:
                log.info("reasons of %s from templates: %s", request.request_id or request.user_id, exc)
            except Exception as exc:  # noqa: BLE001 (a model failure must not fail the answer)
                log.warning("reason generation failed, templates served: %s: %s", type(exc).__name__, exc)
        fresh: dict[str, dict[str, Any]] = {}
        for n, i in enumerate(todo):
            reason = self._judge(evidence[i], None if texts is None else texts[n], gen)
            out[i] = reason
            if texts is not None:  # written and judged (a grounding failure recurs: greedy decoding)
                fresh[keys[i]] = {"text": reason.text, "source": reason.source, "schema_valid": reason.schema_valid}
        if fresh and self.cache is not None:
            self.cache.put_many(fresh)
        reasons = [r for r in out if r is not None]
        self._count(reasons)
        return reasons

    def _judge(self, ev: Evidence, raw: str | None, gen: ReasonGenerator | None = None) -> Reason:
        """The model's reason when it parses and passes the checks, else the template one; ``gen`` (the
        writer) gives the words a clause may use and the request it must not echo."""
        template = template_reason(ev, self.evidence.facts, self.cfg.verb or verb_for(self.domain), self.domain)
        if raw is None:
            return Reason(template, "template")
        parsed = parse_reason(raw)
        if parsed is None:
            return Reason(template, "template", schema_valid=False, problems=("not schema-valid JSON",))
        because, why = parsed
        anchors = anchors_of(ev, self.cfg.anchors)
        if because > len(anchors):
            return Reason(template, "template", schema_valid=True,
                          problems=(f"rests on item {because} of the {len(anchors)} offered",))
        reason = render_reason(str(self.evidence.facts.titles[anchors[because - 1]]), why,
                               self.cfg.verb or verb_for(self.domain))
        words, ask = (None, "") if gen is None else (gen.words(), gen.ask())
        problems = (clause_problems(why, clause_chars(self.cfg), words, ask)
                    + [f"names the title {display_title(str(self.evidence.facts.titles[i]))!r} in its clause"
                       for i in sorted(self.evidence.facts.title_index.find(why))]
                    + self.evidence.facts.check(reason, ev, self.cfg.max_words))
        if problems:
            return Reason(template, "template", schema_valid=True, problems=tuple(problems))
        return Reason(reason, "llm", schema_valid=True)
