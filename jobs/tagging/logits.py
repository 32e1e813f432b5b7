"""Tagging by label logits: closed fields read from one batched pass per batch of items, free text generated.

Per batch of items (``LogitTagger.read``): the instruction's keys/values are computed once for
the catalog (``llm_rerank.forward.run_prefix``); the items' parts continue that cache in one
right-padded batched pass (``continue_batch``; pads masked, positions per row), whose mean final
hidden state over each item's tokens is the item's pooled state (the ``hidden`` of the tag file,
no separate pass); the read-out rows of ``jobs.tagging.label_prompt`` (one cue per closed
field) then run for every item in one more batched pass over the items' caches, and
``LabelLayout.value_probs`` turns their logits into a probability per value. No text is
generated for closed fields, so no retry and no invalid enum value is possible.

Free text (``summary``) is generated from the same item caches, before calibration (it does not
depend on the thresholds): greedy decoding after the cue ``Summary: "``, all items of the batch
at once, constrained by the xgrammar grammar of that field's own JSON schema (a string of at
most 60 characters), so only that field is generated. ``tag_items`` then fits thresholds
(``jobs.tagging.calibrate``) for ``genres`` (the catalog's categories) on the known items
only (a held-out item's labels are never read), decides every closed field within the schema's
bounds, and assembles each document in schema order and validates it; a free-text value the
token budget cut short is closed and kept (its record says so), an empty one becomes the title.

Deliberately left out: parts and files (``jobs.tagging.run``), the comparison report
(``bench.tagging_logits``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jobs.tagging.calibrate import Thresholds, calibrate, decide, default_thresholds, log_odds
from jobs.tagging.generate import GrammarLogits, Tagger, TaggerSettings
from jobs.tagging.label_prompt import LabelLayout, closed_fields, free_text_fields
from jobs.tagging.schema import fallback_record, validation_errors
from llm_rerank.forward import BatchState, PrefixState, continue_batch, run_prefix
from llm_rerank.template import DEFAULT, PromptTemplate
from recsys.progress import progress_bar

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
        import torch  # lazy: heavy (torch)
        import xgrammar as xgr  # lazy: heavy (xgrammar)

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
        import torch  # lazy: heavy (torch)

        s = self.settings
        self.layout = LabelLayout(self.tok, self.fields, domain=s.domain, title_chars=s.title_chars,
                                  template=self.template, examples=examples)
        with torch.inference_mode():
            self.instruction = run_prefix(self.model, self.layout.instruction)

    def label_probs(self, rows: Sequence[dict[str, Any]]) -> np.ndarray:
        """[len(rows), len(layout.slots)]: the probability of every (field, value) for every row."""
        return self.read(rows)[0]

    def read(self, rows: Sequence[dict[str, Any]]) -> tuple[np.ndarray, list[np.ndarray], list[BatchState]]:
        """(label probabilities [rows, slots], each row's pooled item state, the item caches).

        Two batched passes per batch of items: the item parts after the cached instruction (their
        mean final hidden state is the item's pooled state), then every read-out row of every
        item after its own item cache. Where the model's sliding window would reach a padded
        position (Gemma 3 beyond its window), items run one at a time instead, unpadded.
        """
        import torch  # lazy: heavy (torch)

        if self.instruction is None:
            raise RuntimeError("LogitTagger.load() must run before label_probs")
        lay, pad = self.layout, self.tok.pad_token_id
        items = [lay.item(r["title"], r["description"]) for r in rows]
        longest = self.instruction.length + max(len(i) for i in items) + max(len(r.tokens) for r in lay.rows)
        groups = [[b] for b in range(len(rows))] if self._window_binds(longest + self.settings.max_new_tokens) \
            else [list(range(len(rows)))]
        probs = np.zeros((len(rows), len(lay.slots)), dtype=np.float32)
        pooled: list[np.ndarray] = [np.zeros(0, np.float32)] * len(rows)
        states: list[BatchState] = []
        n_read = len(lay.rows)
        with torch.inference_mode():
            for group in groups:
                base = BatchState.of_prefix(self.instruction, len(group))
                hidden, state = continue_batch(self.model, base, [items[b] for b in group], pad)
                real = state.mask[:, self.instruction.length:].unsqueeze(-1).float()
                means = ((hidden.float() * real).sum(1) / real.sum(1).clamp(min=1.0)).numpy()
                logits, _ = continue_batch(self.model, state.repeat(n_read),
                                           [list(r.tokens) for _ in group for r in lay.rows], pad, logits=True)
                for k, b in enumerate(group):
                    probs[b] = lay.value_probs(logits[k * n_read:(k + 1) * n_read])
                    pooled[b] = means[k].astype(np.float32)
                states.append(state)
        return probs, pooled, states

    def _window_binds(self, length: int) -> bool:
        window = sliding_window(self.model)
        return window is not None and length > window

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

    def free_text(self, rows: Sequence[dict[str, Any]], name: str, states: Sequence[BatchState] | None = None
                  ) -> tuple[list[str], list[int], list[bool]]:
        """(value, generated tokens, closed by the grammar) of free-text field ``name`` for each row.

        ``states``: the item caches ``read`` returned for these rows (the cue then continues each
        item's cache); without them the item parts run again after the instruction.
        """
        lay, s = self.layout, self.settings
        if self.instruction is None:
            raise RuntimeError("LogitTagger.load() must run before free_text")
        cue = lay.free_text_cue(name)
        if states is None:
            prompts = [lay.item(r["title"], r["description"]) + cue for r in rows]
            tokens = greedy_continue(self.model, self.instruction, prompts, self.tok.pad_token_id,
                                     GrammarLogits(self.grammars[name], ['"'] * len(rows)), self.stop_ids,
                                     s.max_new_tokens)
        else:
            tokens = []
            for state in states:
                n = len(state.lengths)
                tokens += greedy_continue(self.model, state, [cue] * n, self.tok.pad_token_id,
                                          GrammarLogits(self.grammars[name], ['"'] * n), self.stop_ids,
                                          s.max_new_tokens)
            if len(tokens) != len(rows):
                raise ValueError(f"free_text: {len(rows)} rows but the item caches hold {len(tokens)}")
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

    def complete(self, rows: Sequence[dict[str, Any]], closed: Sequence[dict[str, Any]],
                 free: Mapping[str, tuple[list[str], list[int], list[bool]]], pooled: Sequence[np.ndarray]
                 ) -> list[dict[str, Any]]:
        """The documents in schema order from the decided closed fields and the generated free text
        (``free_text`` per field), validated; one result per row with its pooled state."""
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


def sliding_window(model: Any) -> int | None:
    """The model's attention window in tokens (Gemma 3's local layers), None when it attends to all."""
    config = getattr(model, "config", None)
    window = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None
    return int(window) if window else None


def greedy_continue(model: Any, state: PrefixState | BatchState, prompts: Sequence[Sequence[int]], pad_id: int,
                    processor: GrammarLogits, stop_ids: set[int], max_new: int) -> list[list[int]]:
    """Greedy tokens after each prompt, all prompts in one batch continuing ``state`` (the cached
    instruction, expanded along the batch, or one cached row per prompt), never mutated. Rows of
    different lengths are right-padded and the pads masked out of every later step
    (``llm_rerank.forward.continue_batch``)."""
    import torch  # lazy: heavy (torch)

    if isinstance(state, PrefixState):
        window = sliding_window(model)
        width = max(len(p) for p in prompts)
        if window and state.length + width + max_new > window and len({len(p) for p in prompts}) > 1:
            # pads inside a sliding window (Gemma 3) would shorten it for the padded rows: run each length apart
            out_by_row: dict[int, list[int]] = {}
            for length in sorted({len(p) for p in prompts}):
                rows = [b for b, p in enumerate(prompts) if len(p) == length]
                sub = GrammarLogits(processor.compiled, [processor.prefills[b] for b in rows])
                for b, tokens in zip(rows, greedy_continue(model, state, [prompts[b] for b in rows], pad_id, sub,
                                                           stop_ids, max_new), strict=True):
                    out_by_row[b] = tokens
            return [out_by_row[b] for b in range(len(prompts))]
        state = BatchState.of_prefix(state, len(prompts))
    batch = len(prompts)
    out: list[list[int]] = [[] for _ in prompts]
    done = torch.zeros(batch, dtype=torch.bool)
    with torch.inference_mode():
        logits, state = continue_batch(model, state, prompts, pad_id, logits=True, room=max_new)
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
            logits, state = continue_batch(model, state, [[int(t)] for t in chosen], pad_id, logits=True)
    return out


def tag_items(tagger: LogitTagger, rows: Sequence[dict[str, Any]], known: Mapping[int, Sequence[str]], *,
              batch_size: int = 16, min_positives: int = 5, shots: int = 0, seed: int = 0,
              progress: bool = True) -> LogitRun:
    """Score every row, calibrate on the rows in ``known`` (row position -> its known labels), decide
    and complete every row. ``known`` must never hold an item whose F1 is reported as held out.
    ``shots`` > 0 shows that many known rows with their labels in the instruction (``pick_examples``)."""
    t0 = time.perf_counter()
    if shots and known:
        tagger.use_examples([(KNOWN_FIELD, str(rows[i]["title"]), list(known[i]))
                             for i in pick_examples(known, shots, seed)])
    probs = np.zeros((len(rows), len(tagger.layout.slots)), dtype=np.float32)
    pooled: list[np.ndarray] = [np.zeros(0, np.float32)] * len(rows)
    free: dict[str, tuple[list[Any], list[Any], list[Any]]] = {
        name: ([None] * len(rows), [0] * len(rows), [False] * len(rows)) for name in tagger.free}
    # items of similar token length share a batch: right padding to the batch's longest item is wasted work
    order = np.argsort([len(tagger.layout.item(r["title"], r["description"])) for r in rows], kind="stable")
    for start in progress_bar(range(0, len(rows), batch_size), desc="tag by logits", enabled=progress, unit="batch"):
        where = order[start : start + batch_size]
        batch = [rows[i] for i in where]
        probs[where], states_pooled, states = tagger.read(batch)
        for i, p in zip(where, states_pooled, strict=True):
            pooled[i] = p
        for name in tagger.free:  # free text does not depend on the thresholds: generated from the same caches
            generated: tuple[list[Any], ...] = tagger.free_text(batch, name, states)
            for acc, part in zip(free[name], generated, strict=True):
                for i, value in zip(where.tolist(), part, strict=True):
                    acc[i] = value
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
    results = tagger.complete(rows, closed, free, pooled)
    t2 = time.perf_counter()
    return LogitRun(results, thresholds, probs, {"passes": t1 - t0, "calibrate_and_assemble": t2 - t1,
                                                 "total": t2 - t0})


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
