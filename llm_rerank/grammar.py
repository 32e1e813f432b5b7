"""Schema-constrained decoding: a JSON schema compiled to an xgrammar grammar, applied to logits.

xgrammar is the grammar engine vLLM uses by default. ``compile_json_schema`` turns a JSON schema
into a compiled grammar for one tokenizer; ``GrammarLogits`` holds one ``GrammarMatcher`` per
batch row and, at every decoding step, masks the logits to the tokens the schema allows next, so
greedy decoding can only write JSON the schema admits. Two decoders use it: the offline tagger
(``jobs.tagging.generate``, through transformers' ``generate``) and the reasons of recommended
items (``llm_rerank.reason_decoding``, its own loop over a cached prefix).

Deliberately left out: the schemas themselves and the decoding loops.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


def compile_json_schema(tokenizer: Any, vocab_size: int, schema: dict[str, Any]) -> tuple[Any, list[int]]:
    """(compiled grammar of ``schema`` for ``tokenizer``, its stop token ids); compact separators."""
    import xgrammar as xgr  # lazy: heavy (xgrammar)

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, separators=(", ", ": "))
    return xgr.GrammarCompiler(info).compile_grammar(grammar), list(info.stop_token_ids)


class GrammarLogits:
    """A transformers logits processor applying one xgrammar matcher per batch row."""

    def __init__(self, compiled: Any, prefills: Sequence[str]) -> None:
        """One matcher per row, each having accepted its row's prefill (the JSON written so far);
        ``compiled`` is one grammar for every row, or a list of one per row."""
        import xgrammar as xgr  # lazy: heavy (xgrammar)

        per_row = list(compiled) if isinstance(compiled, list) else [compiled] * len(prefills)
        if len(per_row) != len(prefills):
            raise ValueError(f"{len(per_row)} grammars for {len(prefills)} rows")
        self.xgr, self.prefills = xgr, list(prefills)
        self.compiled = per_row[0] if per_row else compiled  # the tokenizer's vocab size
        self.matchers = [xgr.GrammarMatcher(c) for c in per_row]
        for m, prefill in zip(self.matchers, prefills, strict=True):
            if not m.accept_string(prefill):
                raise ValueError(f"grammar rejects the prefill {prefill!r}")
        self.bitmask = xgr.allocate_token_bitmask(len(prefills), self.compiled.tokenizer_info.vocab_size)
        self.started = False

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        """``scores`` [B, V] masked for the next token; ``input_ids[:, -1]`` are the tokens just chosen
        (ignored on the first call, which masks the first generated token)."""
        if self.started:
            for i, m in enumerate(self.matchers):
                if not m.is_terminated():
                    m.accept_token(int(input_ids[i, -1]))
        self.started = True
        self.xgr.reset_token_bitmask(self.bitmask)
        for i, m in enumerate(self.matchers):
            if not m.is_terminated():
                m.fill_next_token_bitmask(self.bitmask, i)
        scores = scores.float()
        self.xgr.apply_token_bitmask_inplace(scores, self.bitmask)
        return scores

    def terminated(self, row: int) -> bool:
        """Row ``row`` has written a whole document (and its stop token)."""
        return bool(self.matchers[row].is_terminated())
