"""Token layout for tagging by label logits, and value probabilities from the read-out logits.

Three levels, each computed once (``llm_rerank.forward`` prefix helpers):

1. the *instruction* (chat head: system line, opening of the user message), shared by the
   whole catalog;
2. the *item* part: ``Movie: «title»``, the description, the request and the chat tail up to
   the assistant turn (one per item, continuing the instruction's cache);
3. *read-out rows*, the same token rows for every item: a field's cue (``Genre:``) and, where
   two values share their first tokens, the cue followed by that shared path. All rows of an
   item run in one batched pass over the item's cache; only the last position of each is read.

A value's probability is the probability that decoding constrained to the field's values
(what the JSON-schema grammar of the generation path allows) writes that value after the cue:
the product, over the branch points of the token trie of the values, of the softmax restricted
to the tokens allowed there. A value of several tokens (`` Film-Noir``, `` Children's``) is
therefore read whole, with no extra row unless another value starts with the same tokens
(``Home & Kitchen`` / ``Home Improvement``: one more row at ``Home``); a value that is a prefix
of another ends with a newline token so the two stay apart. Why not a Yes/No question per
label: it costs one row of about ten tokens per label (37 for the movie schema) where this
costs one short row per field, and on this CPU tokens are the cost (SmolLM2 fp32 runs at a few
hundred tokens/s); the first-token read-out also gives the model's own choice among the values.

Closed fields come from the schema: a property whose value (or array items) has an ``enum``.
Free-text fields (a ``string`` without enum: ``summary``) get a cue ending in an opening quote
and are generated (``jobs.tagging.logits``).

Deliberately left out: running the model (``jobs.tagging.logits``), thresholds
(``jobs.tagging.calibrate``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from llm_rerank.prompt import PromptBuilder, sanitise_title
from llm_rerank.template import CLOSE, DEFAULT, OPEN, PromptTemplate

LABEL_PROMPT_VERSION = "l1"
CUES = {"genres": "Genre", "audience": "Audience", "risk_flags": "Risk", "themes": "Theme", "summary": "Summary"}


@dataclass(frozen=True)
class ClosedField:
    """One closed field of the schema: its values and how many of them a document may hold."""

    name: str
    values: tuple[str, ...]
    many: bool  # an array of enum values (else exactly one value)
    min_items: int
    max_items: int


@dataclass(frozen=True)
class ReadRow:
    """One read-out row: at its last token the model chooses among ``choices`` (next token id ->
    indices of the field's values below it)."""

    field: str
    tokens: tuple[int, ...]
    choices: dict[int, list[int]]


def closed_fields(schema: dict[str, Any]) -> list[ClosedField]:
    """The schema's closed fields in property order.

    >>> s = {"properties": {"g": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 1},
    ...                     "a": {"enum": ["x", "y"]}, "t": {"type": "string"}}}
    >>> [(f.name, f.values, f.many, f.min_items, f.max_items) for f in closed_fields(s)]
    [('g', ('a', 'b'), True, 0, 1), ('a', ('x', 'y'), False, 1, 1)]
    """
    out = []
    for name, prop in schema["properties"].items():
        if "enum" in prop.get("items", {}):
            values = tuple(str(v) for v in prop["items"]["enum"])
            out.append(ClosedField(name, values, True, int(prop.get("minItems", 0)),
                                   int(prop.get("maxItems", len(values)))))
        elif "enum" in prop:
            out.append(ClosedField(name, tuple(str(v) for v in prop["enum"]), False, 1, 1))
    return out


def free_text_fields(schema: dict[str, Any]) -> list[str]:
    """Schema properties that are not closed fields: what generation must write."""
    closed = {f.name for f in closed_fields(schema)}
    return [name for name in schema["properties"] if name not in closed]


def branch_points(sequences: Sequence[Sequence[int]]) -> list[tuple[tuple[int, ...], dict[int, list[int]]]]:
    """(path, {next token: value indices}) wherever the token sequences of the values diverge.

    >>> branch_points([[1], [2, 3], [2, 4], [5, 6, 7]])
    [((), {1: [0], 2: [1, 2], 5: [3]}), ((2,), {3: [1], 4: [2]})]
    """
    for i, seq in enumerate(sequences):
        if not seq:
            raise ValueError(f"value {i} has no tokens")
        for j, other in enumerate(sequences):
            if i != j and len(seq) <= len(other) and list(other[: len(seq)]) == list(seq):
                raise ValueError(f"value {i}'s tokens {list(seq)} are a prefix of value {j}'s {list(other)}")
    out: list[tuple[tuple[int, ...], dict[int, list[int]]]] = []

    def walk(members: list[int], depth: int) -> None:
        groups: dict[int, list[int]] = {}
        for m in members:
            groups.setdefault(int(sequences[m][depth]), []).append(m)
        if len(groups) > 1:
            out.append((tuple(int(t) for t in sequences[members[0]][:depth]), groups))
        for group in groups.values():
            if len(group) > 1:
                walk(group, depth + 1)

    walk(list(range(len(sequences))), 0)
    return sorted(out, key=lambda p: (len(p[0]), p[0]))


class LabelLayout:
    """Token ids of the instruction, of one item, of every read-out row and of the free-text cues."""

    def __init__(self, tokenizer: Any, fields: Sequence[ClosedField], *, domain: str = "movie",
                 title_chars: int = 60, template: PromptTemplate = DEFAULT,
                 examples: Sequence[tuple[str, str, Sequence[str]]] = ()) -> None:
        """``examples``: (field, title, known values) shown after the instruction (few-shot); they are part
        of the cached instruction, so they cost nothing per item."""
        self.domain, self.title_chars, self.fields = domain, title_chars, list(fields)
        fields_named = ", ".join(CUES.get(f.name, f.name).lower() for f in self.fields)
        instruction = f"{template.render('tagging_system', domain)} Give the {domain}'s {fields_named} and summary."
        # descriptions are 4x a title's length: the builder cuts every data slot at title_chars
        self.builder = PromptBuilder(tokenizer, domain=domain, title_chars=4 * title_chars,
                                     template=PromptTemplate(system=instruction))
        b = self.builder
        self.instruction = b.ids(b.head)
        for name, title, values in examples:
            self.instruction += (b.ids(f"{domain.capitalize()}: {OPEN}") + b.title_ids(
                sanitise_title(title, title_chars, b.special_tokens)) + b.ids(f"{CLOSE}\n{self.cue(name)}: ")
                + b.ids(", ".join(sanitise_title(v, title_chars, b.special_tokens) for v in values) + "\n\n"))
        self.tail = b.ids(b.tail[: -len("Answer:")] if b.tail.endswith("Answer:") else b.tail)
        self.newline = b.ids("\n")
        self.slots: list[tuple[str, str]] = []  # (field, value), fields in schema order
        self.spans: dict[str, tuple[int, int]] = {}
        self.rows: list[ReadRow] = []
        for f in self.fields:
            self.spans[f.name] = (len(self.slots), len(self.slots) + len(f.values))
            self.slots += [(f.name, v) for v in f.values]
            cue = b.ids(f"{self.cue(f.name)}:")
            seqs = [b.ids(" " + sanitise_title(v.replace("_", " "), title_chars, b.special_tokens)) for v in f.values]
            if len({tuple(s) for s in seqs}) < len(seqs):
                raise ValueError(f"field {f.name!r}: two values have the same tokens: {list(f.values)}")
            if _has_prefix_pair(seqs):  # end each value with a newline so "Action" and "Action Comedy" differ
                seqs = [s + self.newline for s in seqs]
            for path, choices in branch_points(seqs):
                self.rows.append(ReadRow(f.name, tuple(cue) + path, choices))

    @staticmethod
    def cue(field: str) -> str:
        return CUES.get(field, field.replace("_", " ").capitalize())

    def item(self, title: str, description: str) -> list[int]:
        """The item part, ending at the start of the assistant turn (the cues follow it)."""
        b = self.builder
        ids = b.ids(f"{self.domain.capitalize()}: {OPEN}") + b.title_ids(
            sanitise_title(title, self.title_chars, b.special_tokens)) + b.ids(f"{CLOSE}\n")
        if description:
            ids += b.ids(f"Description: {OPEN}") + b.title_ids(description) + b.ids(f"{CLOSE}\n")
        return ids + self.tail

    def free_text_cue(self, field: str) -> list[int]:
        """``Summary: "``: the generated JSON string continues it (the grammar's prefill is ``"``)."""
        return self.builder.ids(f'{self.cue(field)}: "')

    def value_probs(self, logits: Any) -> np.ndarray:
        """[len(slots)] probability of every (field, value) from the logits [len(rows), V] of one item."""
        import torch  # lazy: heavy (torch)

        logp = np.zeros(len(self.slots), dtype=np.float64)
        for r, row in enumerate(self.rows):
            start = self.spans[row.field][0]
            tokens = list(row.choices)
            restricted = torch.log_softmax(logits[r, tokens].double(), dim=-1).cpu().numpy()
            for k, token in enumerate(tokens):
                for v in row.choices[token]:
                    logp[start + v] += restricted[k]
        return np.exp(logp).astype(np.float32)


def _has_prefix_pair(seqs: Sequence[Sequence[int]]) -> bool:
    return any(i != j and len(a) < len(b) and list(b[: len(a)]) == list(a)
               for i, a in enumerate(seqs) for j, b in enumerate(seqs))
