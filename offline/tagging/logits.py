"""Tagging by label logits: closed fields read from one batched pass per item, free text generated.

Per item (``LogitTagger.label_probs``): the instruction's keys/values are computed once for the
catalog (``llm_rerank.scoring.run_prefix``); the item part continues that cache
(``extend_prefix``); the read-out rows of ``offline.tagging.label_prompt`` (one cue per closed
field) run in one batched pass over the item's cache (``suffix_logits``), and
``LabelLayout.value_probs`` turns their logits into a probability per value. No text is
generated for closed fields, so no retry and no invalid enum value is possible.

``tag_items`` fits thresholds (``offline.tagging.calibrate``) for ``genres`` (the catalog's
categories) on the known items only (a held-out item's labels are never read), decides every
closed field within the schema's bounds, and generates each free-text field (``summary``) for a
batch of items at once: greedy decoding over the cached instruction, after the item and the
cue ``Summary: "``, constrained by the xgrammar grammar of that field's own JSON schema
(a string of at most 60 characters), so only that field is generated. The document is assembled
in schema order and validated; a free-text value the token budget cut short is closed and
kept (its record says so), an empty one becomes the title.

Deliberately left out: parts and files (``offline.tagging.run``), the comparison report
(``offline.tagging.bench_logits``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llm_rerank.scoring import PrefixState, extend_prefix, run_prefix, suffix_logits
from llm_rerank.template import DEFAULT, PromptTemplate
from offline.tagging.calibrate import Thresholds, calibrate, decide, default_thresholds, log_odds
from offline.tagging.generate import GrammarLogits, Tagger, TaggerSettings
from offline.tagging.label_prompt import LabelLayout, closed_fields, free_text_fields
from offline.tagging.schema import fallback_record, validation_errors

KNOWN_FIELD = "genres"  # the field whose values are the catalog's categories (schema.concrete_schema)


@dataclass
class LogitRun:
    """What ``tag_items`` returns: one result per row, the thresholds per field, and timings."""

    results: list[dict[str, Any]]
    thresholds: dict[str, Thresholds]
    probs: np.ndarray  # [items, slots] probability of every (field, value)
    seconds: dict[str, float] = field(default_factory=dict)


class LogitTagger:
    """Model, layout, cached instruction and free-text grammars; ``load`` before use."""

    def __init__(self, model_dir: str, schema: dict[str, Any], settings: TaggerSettings,
                 template: PromptTemplate = DEFAULT) -> None:
        self.schema, self.settings, self.template = schema, settings, template
        self.fields = closed_fields(schema)
        self.free = free_text_fields(schema)
        for name in self.free:
            if schema["properties"][name].get("type") != "string":
                raise ValueError(f"logits tagging: field {name!r} is neither closed (enum) nor a string")
        self.generator = Tagger(model_dir, schema, settings, template)  # model, tokenizer, pooled states
        self.instruction: PrefixState | None = None

    def load(self) -> LogitTagger:
        import torch
        import xgrammar as xgr

        self.generator.load()
        self.model, self.tok = self.generator.model, self.generator.tok
        s = self.settings
        self.layout = LabelLayout(self.tok, self.fields, domain=s.domain, title_chars=s.title_chars,
                                  template=self.template)
        compiler = xgr.GrammarCompiler(self.generator.compiled.tokenizer_info)
        self.grammars = {name: compiler.compile_json_schema(json.dumps(self.schema["properties"][name]),
                                                            any_whitespace=False) for name in self.free}
        self.stop_ids = set(self.generator.stop_ids)
        with torch.inference_mode():
            self.instruction = run_prefix(self.model, self.layout.instruction)
        return self

    def use_examples(self, examples: Sequence[tuple[str, str, Sequence[str]]]) -> None:
        """Show ``examples`` (field, title, values) in the instruction and recompute its cache."""
        import torch

        s = self.settings
        self.layout = LabelLayout(self.tok, self.fields, domain=s.domain, title_chars=s.title_chars,
                                  template=self.template, examples=examples)
        with torch.inference_mode():
            self.instruction = run_prefix(self.model, self.layout.instruction)

    def label_probs(self, rows: Sequence[dict[str, Any]]) -> np.ndarray:
        """[len(rows), len(layout.slots)]: the probability of every (field, value) for every row."""
        import torch

        if self.instruction is None:
            raise RuntimeError("LogitTagger.load() must run before label_probs")
        lay = self.layout
        read = [list(r.tokens) for r in lay.rows]
        out = np.zeros((len(rows), len(lay.slots)), dtype=np.float32)
        with torch.inference_mode():
            for i, row in enumerate(rows):
                state = extend_prefix(self.model, self.instruction, lay.item(row["title"], row["description"]))
                out[i] = lay.value_probs(suffix_logits(self.model, state, read, self.tok.pad_token_id))
        return out

    def closed_values(self, probs: np.ndarray, thresholds: dict[str, Thresholds]) -> list[dict[str, Any]]:
        """The decided closed fields of every row (values ordered by margin over their threshold)."""
        docs: list[dict[str, Any]] = [{} for _ in range(len(probs))]
        for f in self.fields:
            start, stop = self.layout.spans[f.name]
            chosen = decide(probs[:, start:stop], thresholds[f.name].per_label, f.min_items, f.max_items)
            margin = log_odds(probs[:, start:stop]) - log_odds(thresholds[f.name].per_label)
            for i, doc in enumerate(docs):
                values = [f.values[j] for j in np.argsort(-margin[i], kind="stable") if chosen[i, j]]
                doc[f.name] = values if f.many else values[0]
        return docs

    def free_text(self, rows: Sequence[dict[str, Any]], name: str) -> tuple[list[str], list[int], list[bool]]:
        """(value, generated tokens, closed by the grammar) of free-text field ``name`` for each row."""
        lay, s = self.layout, self.settings
        if self.instruction is None:
            raise RuntimeError("LogitTagger.load() must run before free_text")
        prompts = [lay.item(r["title"], r["description"]) + lay.free_text_cue(name) for r in rows]
        processor = GrammarLogits(self.grammars[name], ['"'] * len(rows))
        tokens = greedy_continue(self.model, self.instruction, prompts, self.tok.pad_token_id, processor,
                                 self.stop_ids, s.max_new_tokens)
        limit = int(self.schema["properties"][name].get("maxLength", 10**6))
        values, closed = [], []
        for row, ids in zip(rows, tokens, strict=True):
            text = '"' + self.tok.decode(ids, skip_special_tokens=True)
            try:
                value, done = str(json.loads(text)), True
            except json.JSONDecodeError:  # the budget ran out inside the string: keep what was written
                value, done = text[1:].replace("\\", "").strip(), False
            values.append(value[:limit].strip() or str(row["title"])[:limit])
            closed.append(done)
        return values, [len(t) for t in tokens], closed

    def complete(self, rows: Sequence[dict[str, Any]], closed: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Free-text fields for a batch, the documents in schema order, validated; one result per row."""
        free = {name: self.free_text(rows, name) for name in self.free}
        pooled = self.generator.pooled_states([r["text"] or r["title"] for r in rows])
        out = []
        for i, row in enumerate(rows):
            doc = {name: closed[i][name] if name in closed[i] else free[name][0][i] for name in self.schema["properties"]}
            cut = [name for name in self.free if not free[name][2][i]]
            errors = validation_errors(doc, self.schema)
            record: dict[str, Any] = (dict(doc, fallback=False, reason=f"token budget cut {cut}" if cut else "")
                                      if not errors else fallback_record("; ".join(errors[:3])))
            out.append({"item_idx": int(row["item_idx"]), **record, "raw": json.dumps(doc, ensure_ascii=False),
                        "attempts": 1, "new_tokens": int(sum(free[n][1][i] for n in self.free)),
                        "hidden": pooled[i]})
        return out


def greedy_continue(model: Any, state: PrefixState, prompts: Sequence[Sequence[int]], pad_id: int,
                    processor: GrammarLogits, stop_ids: set[int], max_new: int) -> list[list[int]]:
    """Greedy tokens after each prompt, all prompts in one batch continuing ``state`` (the cached
    instruction, expanded along the batch, never mutated). Prompts are right-padded; the pads are
    masked out of every later step, and positions continue from each prompt's own length."""
    import torch
    from transformers import DynamicCache

    batch, width = len(prompts), max(len(p) for p in prompts)
    window = getattr(model.config, "sliding_window", None) if getattr(model.config, "use_sliding_window", True) else None
    if window and state.length + width + max_new > window and len({len(p) for p in prompts}) > 1:
        # pads inside a sliding window (Gemma 3) would shorten it for the padded rows: run each length apart
        out_by_row: dict[int, list[int]] = {}
        for length in sorted({len(p) for p in prompts}):
            rows = [b for b, p in enumerate(prompts) if len(p) == length]
            sub = GrammarLogits(processor.compiled, [processor.prefills[b] for b in rows])
            for b, tokens in zip(rows, greedy_continue(model, state, [prompts[b] for b in rows], pad_id, sub,
                                                       stop_ids, max_new), strict=True):
                out_by_row[b] = tokens
        return [out_by_row[b] for b in range(batch)]
    ids = torch.full((batch, width), pad_id, dtype=torch.long)
    real = torch.zeros((batch, width), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, : len(p)] = torch.tensor(list(p), dtype=torch.long)
        real[b, : len(p)] = 1
    lengths = real.sum(1)
    cache = DynamicCache(ddp_cache_data=[(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1))
                                         for k, v in state.kv])
    mask = torch.cat([torch.ones((batch, state.length), dtype=torch.long), real], dim=1)
    positions = (state.length + torch.arange(width)).unsqueeze(0).expand(batch, -1)
    out: list[list[int]] = [[] for _ in prompts]
    done = torch.zeros(batch, dtype=torch.bool)
    with torch.inference_mode():
        # the LM head only at each prompt's last position (Gemma 3's vocabulary is 262k)
        keep, where = torch.unique(lengths - 1, return_inverse=True)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
                       logits_to_keep=keep).logits[torch.arange(batch), where]
        history = torch.zeros((batch, 0), dtype=torch.long)
        for step in range(max_new):
            scores = processor(history, logits.float())
            chosen = scores.argmax(-1)
            for b in range(batch):
                if not done[b]:
                    token = int(chosen[b])
                    if token in stop_ids:
                        done[b] = True
                    else:
                        out[b].append(token)
            if bool(done.all()) or step == max_new - 1:
                break
            history = torch.cat([history, chosen.unsqueeze(1)], dim=1)
            mask = torch.cat([mask, torch.ones((batch, 1), dtype=torch.long)], dim=1)
            position = (state.length + lengths + step).unsqueeze(1)
            logits = model(input_ids=chosen.unsqueeze(1), attention_mask=mask, position_ids=position, cache=cache,
                           use_cache=True).logits[:, -1]
    return out


def tag_items(tagger: LogitTagger, rows: Sequence[dict[str, Any]], known: Mapping[int, Sequence[str]], *,
              batch_size: int = 16, min_positives: int = 5, shots: int = 0, seed: int = 0,
              progress: bool = True) -> LogitRun:
    """Score every row, calibrate on the rows in ``known`` (row position -> its known labels), decide
    and complete every row. ``known`` must never hold an item whose F1 is reported as held out.
    ``shots`` > 0 shows that many known rows with their labels in the instruction (``pick_examples``)."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    if shots and known:
        tagger.use_examples([(KNOWN_FIELD, str(rows[i]["title"]), list(known[i]))
                             for i in pick_examples(known, shots, seed)])
    probs = np.zeros((len(rows), len(tagger.layout.slots)), dtype=np.float32)
    for start in tqdm(range(0, len(rows), batch_size), desc="label logits", disable=not progress):
        probs[start : start + batch_size] = tagger.label_probs(rows[start : start + batch_size])
    t1 = time.perf_counter()
    thresholds = {}
    for f in tagger.fields:
        thresholds[f.name] = default_thresholds(len(f.values))
        if f.name == KNOWN_FIELD and known:
            start, stop = tagger.layout.spans[f.name]
            col = {v: j for j, v in enumerate(f.values)}
            idx = np.array(sorted(known), dtype=np.int64)
            truth = np.zeros((len(idx), len(f.values)), dtype=bool)
            for r, i in enumerate(idx):
                truth[r, [col[v] for v in known[int(i)] if v in col]] = True
            thresholds[f.name] = calibrate(probs[idx, start:stop], truth, f.min_items, f.max_items,
                                           min_positives=min_positives)
    closed = tagger.closed_values(probs, thresholds)
    t2 = time.perf_counter()
    results = []
    for start in tqdm(range(0, len(rows), batch_size), desc="free text", disable=not progress):
        results += tagger.complete(rows[start : start + batch_size], closed[start : start + batch_size])
    t3 = time.perf_counter()
    return LogitRun(results, thresholds, probs, {"label_scoring": t1 - t0, "calibration": t2 - t1,
                                                 "free_text_and_states": t3 - t2, "total": t3 - t0})


def pick_examples(known: Mapping[int, Sequence[str]], shots: int, seed: int) -> list[int]:
    """``shots`` known rows in a seeded order, first those that show a label not shown yet.

    >>> pick_examples({0: ["A"], 1: ["A"], 2: ["B"], 3: ["C"]}, 3, 0)
    [2, 0, 3]
    """
    order = [int(i) for i in np.random.default_rng(seed).permutation(sorted(known))]
    shown: set[str] = set()
    picked: list[int] = []
    for i in order:
        if len(picked) < shots and set(known[i]) - shown:
            picked.append(i)
            shown |= set(known[i])
    picked += [i for i in order if i not in picked][: shots - len(picked)]
    return picked
