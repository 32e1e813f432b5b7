"""The per-batch tagging function: grammar-constrained greedy JSON + pooled hidden states.

``Tagger.tag_batch(rows)`` is the one function both engines run (``jobs.tagging.job`` on
this machine, ``jobs.tagging.ray_engine`` inside Ray actors), so their outputs agree bit for
bit when they see the same batches with the same thread count.

Decoding is constrained with xgrammar (the grammar engine vLLM uses by default): the tag
schema compiles to a grammar, each row's ``GrammarMatcher`` first accepts the assistant
prefill, then at every step the allowed-token bitmask is applied to the logits, so greedy
decoding can only produce JSON the schema admits. A row that still fails (the token budget
ran out) is retried alone with twice the budget, then recorded as a fallback.

The embedding input is the mean of the last hidden states over the item's text tokens (a
separate, short forward pass); the projection to 256-d is trained by
``jobs.tagging.embed``. Raw per-token states are never kept.

Deliberately left out: chunking, resuming and files (``jobs.tagging.job``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from jobs.tagging.prompt import PREFILL, render_prompt
from jobs.tagging.schema import fallback_record, parse_and_validate
from llm_rerank.backbone import load_model
from llm_rerank.grammar import GrammarLogits, compile_json_schema
from llm_rerank.template import DEFAULT, PromptTemplate


@dataclass(frozen=True)
class TaggerSettings:
    """What decoding depends on; part of the output version."""

    domain: str = "movie"
    precision: str = "auto"  # llm_rerank.backbone.resolve_precision
    max_new_tokens: int = 128  # ML-100K tags average 114 new tokens; at 80, 44% of items needed the retry
    title_chars: int = 60
    embed_max_tokens: int = 64
    threads: int | None = None


class Tagger:
    """Model + tokenizer + compiled grammar + prompt document; ``tag_batch`` is the unit of work."""

    def __init__(self, model_dir: str, schema: dict[str, Any], settings: TaggerSettings,
                 template: PromptTemplate = DEFAULT) -> None:
        self.model_dir, self.schema, self.settings, self.template = model_dir, schema, settings, template
        self.model: Any = None

    def load(self) -> Tagger:
        self.model, self.tok = load_model(self.model_dir, self.settings.precision, self.settings.threads)
        if self.tok.pad_token_id is None:
            self.tok.pad_token = self.tok.eos_token
        self.compiled, self.stop_ids = compile_json_schema(self.tok, self.model.config.vocab_size, self.schema)
        return self

    def tag_batch(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Rows hold item_idx, title, description, text; returns one result per row, same order."""
        s = self.settings
        prompts = [render_prompt(self.tok, s.domain, r["title"], r["description"], s.title_chars, self.template)
                   for r in rows]
        texts, tokens = self._generate(prompts, s.max_new_tokens)
        pooled = self.pooled_states([r["text"] or r["title"] for r in rows])
        out = []
        for i, row in enumerate(rows):
            record, reason = parse_and_validate(texts[i], self.schema)
            attempts = 1
            if record is None:  # retry alone with a doubled budget (greedy: same prefix, longer tail)
                attempts = 2
                retry, more = self._generate([prompts[i]], 2 * s.max_new_tokens)
                record, reason2 = parse_and_validate(retry[0], self.schema)
                texts[i], tokens[i] = retry[0], tokens[i] + more[0]
                if record is None:
                    record = fallback_record(f"{reason} | retry: {reason2}")
            record.setdefault("fallback", False)
            record.setdefault("reason", "")
            out.append({"item_idx": int(row["item_idx"]), **record, "raw": texts[i], "attempts": attempts,
                        "new_tokens": int(tokens[i]), "hidden": pooled[i]})
        return out

    def _generate(self, prompts: list[str], max_new: int,
                  prefills: Sequence[str] | None = None) -> tuple[list[str], list[int]]:
        """Greedy grammar-constrained continuations; each text starts with its row's prefill (the
        tail of its prompt: ``PREFILL``, or the closed fields ``jobs.tagging.logits`` decided)."""
        import torch  # lazy: heavy (torch)

        prefills = [PREFILL] * len(prompts) if prefills is None else list(prefills)
        self.tok.padding_side = "left"
        enc = self.tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        processor = GrammarLogits(self.compiled, prefills)
        with torch.inference_mode():
            out = self.model.generate(**enc, max_new_tokens=max_new, do_sample=False, logits_processor=[processor],
                                      eos_token_id=self.stop_ids, pad_token_id=self.tok.pad_token_id)
        new = out[:, enc["input_ids"].shape[1]:]
        texts, counts = [], []
        for prefill, row in zip(prefills, new.tolist(), strict=True):
            ids = [t for t in row if t not in self.stop_ids and t != self.tok.pad_token_id]
            texts.append(prefill + self.tok.decode(ids, skip_special_tokens=True))
            counts.append(len(ids))
        return texts, counts

    def pooled_states(self, texts: list[str]) -> list[np.ndarray]:
        """Mean of the last hidden layer over each text's tokens (float32; ``pooled_states``)."""
        return pooled_states(self.model, self.tok, texts, self.settings.embed_max_tokens)


def pooled_states(model: Any, tok: Any, texts: list[str], max_tokens: int) -> list[np.ndarray]:
    """Mean of ``model``'s last hidden layer over each text's first ``max_tokens`` tokens (float32).

    One forward pass over the batch, right-padded, padding masked out of the mean; the tagger and
    the embedding-only job (``jobs.tagging.hidden_states``) both pool through here.
    """
    import torch  # lazy: heavy (torch)

    tok.padding_side = "right"
    enc = tok(texts, return_tensors="pt", padding=True, truncation=True, max_length=max_tokens,
              add_special_tokens=False)
    with torch.inference_mode():
        hidden = model.model(**enc).last_hidden_state.float()
    mask = enc["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
    return [row.numpy().astype(np.float32) for row in pooled]
