"""Decoding the rows of reasons: in process over the re-ranker's prefix cache, or on an LLM server.

``ReasonGenerator`` (``llm_rerank.explain``) builds one row per item (the re-ranker's prefix and an
item suffix, as token ids) and a JSON schema per row (``llm_rerank.anchored.reason_schema``); a
decoder turns them into one JSON text per row, greedily and schema-constrained:

- ``LocalReasonDecoder``: the stage's in-process model. The prefix's keys/values come from the
  re-ranker's prefix cache; every row continues them in one batch under xgrammar
  (``llm_rerank.grammar``). A row still open when the token budget ends is closed as soon as the
  schema allows, so it stays a valid document.
- ``RemoteReasonDecoder``: an OpenAI-compatible server (``vllm serve`` on GPU, or the project's CPU
  worker ``serving.llm_worker``), the ``http`` backend's model. One ``/v1/completions`` call per
  schema holds every row as token ids with ``structured_outputs: {"json": schema}`` (vLLM's structured
  outputs); the server's automatic prefix caching shares the user's prefix between the rows and
  the re-ranker's own request.

Both raise ``StageError`` once the deadline has passed, so the caller serves template reasons.

Deliberately left out: what the rows say and how a JSON text becomes a served reason
(``llm_rerank.explain``, ``llm_rerank.anchored``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

from llm_rerank.grammar import GrammarLogits, compile_json_schema
from llm_rerank.remote import RemoteLLM
from recsys.contract import StageError

_COMPILED: dict[tuple[Any, ...], tuple[Any, list[int]]] = {}  # (tokenizer, vocab, schema) -> grammar, stops
_COMPILED_LOCK = threading.Lock()


class ReasonDecoder(Protocol):
    """Writes one JSON text per row: ``prefix + suffixes[i]`` constrained by ``schemas[i]``."""

    def decode(self, prefix: Sequence[int], suffixes: Sequence[Sequence[int]], schemas: Sequence[dict[str, Any]],
               deadline: float) -> list[str]:
        """Greedy, schema-constrained; ``StageError`` once ``time.monotonic()`` passes ``deadline``."""
        ...


def check_deadline(deadline: float) -> None:
    """``StageError`` when the reasons' budget has run out."""
    if time.monotonic() >= deadline:
        raise StageError("explanation budget reached before the reasons were written")


def _schema_key(schema: dict[str, Any]) -> str:
    return json.dumps(schema, sort_keys=True)


class LocalReasonDecoder:
    """Decodes rows with the in-process model over the re-ranker's prefix cache (module docstring)."""

    def __init__(self, model: Any, tokenizer: Any, pad_id: int, scorer: Any, max_new_tokens: int,
                 close: Sequence[int]) -> None:
        """``scorer`` holds the re-ranker's prefix cache (``llm_rerank.backends.LocalBackend.scorer``);
        ``close`` are the ids of ``"}`` as the prompt builder writes them (what closes an open row)."""
        self.model, self.tok, self.pad_id, self.scorer = model, tokenizer, pad_id, scorer
        self.max_new_tokens, self.close = max_new_tokens, list(close)
        self.vocab = int(getattr(model.config, "vocab_size", len(tokenizer)))

    def grammar(self, schema: dict[str, Any]) -> tuple[Any, list[int]]:
        """(``schema`` compiled for this tokenizer, its stop ids); compiled once per tokenizer and process
        (a compile takes seconds)."""
        key = (str(getattr(self.tok, "name_or_path", "")), len(self.tok), self.vocab, _schema_key(schema))
        with _COMPILED_LOCK:
            if key not in _COMPILED:
                _COMPILED[key] = compile_json_schema(self.tok, self.vocab, schema)
            return _COMPILED[key]

    def decode(self, prefix: Sequence[int], suffixes: Sequence[Sequence[int]], schemas: Sequence[dict[str, Any]],
               deadline: float) -> list[str]:
        import torch  # lazy: heavy (torch)

        from llm_rerank.forward import BatchState, continue_batch  # lazy: imports torch

        check_deadline(deadline)
        compiled = [self.grammar(s) for s in schemas]
        stops = compiled[0][1] if compiled else []
        stop_ids = set(stops)
        # a row still open when the token budget ends is closed with these (the string, the object, a stop)
        close_ids = [*self.close, *stops[:1]]
        steps = self.max_new_tokens
        with torch.inference_mode():
            state = BatchState.of_prefix(self.scorer.prefix_state(list(prefix)), len(suffixes))
            check_deadline(deadline)
            grammar = GrammarLogits([c for c, _ in compiled], [""] * len(suffixes))
            logits, state = continue_batch(self.model, state, [list(s) for s in suffixes], self.pad_id,
                                           logits=True, room=steps)
            out: list[list[int]] = [[] for _ in suffixes]
            chosen = torch.full((len(suffixes), 1), self.pad_id, dtype=torch.long)
            closing = steps - len(close_ids)
            forced = [-1] * len(suffixes)  # per row: close ids written so far once closing began

            def open_row(row: int) -> bool:
                return not grammar.terminated(row) and not (out[row] and out[row][-1] in stop_ids)

            for step in range(steps):
                masked = grammar(chosen, logits)
                chosen = masked.argmax(dim=-1, keepdim=True)
                for row in range(len(suffixes)):
                    if open_row(row):
                        # out of budget: close the JSON as soon as the schema allows (the clause long enough),
                        # so the row stays a valid document; one that cannot close in time is not served
                        if forced[row] < 0 and step >= closing and bool(masked[row, close_ids[0]] > -1e30):
                            forced[row] = 0
                        if 0 <= forced[row] < len(close_ids):
                            chosen[row, 0] = close_ids[forced[row]]
                            forced[row] += 1
                        out[row].append(int(chosen[row, 0]))
                if not any(open_row(r) for r in range(len(suffixes))) or step == steps - 1:
                    break
                check_deadline(deadline)
                logits, state = continue_batch(self.model, state, chosen.tolist(), self.pad_id, logits=True)
        return [self.tok.decode([t for t in ids if t not in stop_ids], skip_special_tokens=True) for ids in out]


class RemoteReasonDecoder:
    """Decodes rows on an OpenAI-compatible server, one call per distinct schema (module docstring)."""

    def __init__(self, remote: RemoteLLM, max_new_tokens: int) -> None:
        self.remote, self.max_new_tokens = remote, max_new_tokens

    def decode(self, prefix: Sequence[int], suffixes: Sequence[Sequence[int]], schemas: Sequence[dict[str, Any]],
               deadline: float) -> list[str]:
        check_deadline(deadline)
        groups: dict[str, list[int]] = {}
        for row, schema in enumerate(schemas):
            groups.setdefault(_schema_key(schema), []).append(row)
        out = [""] * len(suffixes)
        for rows in groups.values():
            check_deadline(deadline)
            timeout = min(deadline - time.monotonic(), self.remote.timeout_s)  # the budget, at most the client's
            texts = self.remote.json_completions([[*prefix, *suffixes[r]] for r in rows], schemas[rows[0]],
                                                 max_tokens=self.max_new_tokens, timeout_s=timeout)
            for r, text in zip(rows, texts, strict=True):
                out[r] = text
        return out
