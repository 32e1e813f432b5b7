"""The tagging prompt: what the LLM sees for one item, and the target text used to adapt it.

Layout: the tokenizer's chat template with a system line, a user message naming the item
(title between « », description), then the assistant prefill ``{"genres": [`` that opens the
JSON, so decoding starts inside the object the grammar describes. The instruction (system line) and
the request line come from a ``llm_rerank.template.PromptTemplate``, the same prompt document
the re-ranker serves (``tagging_system``, ``tagging_request``); the built-in one by default.

The description never states the catalog's categories: MovieLens ``text`` reads
"Toy Story (1995). Genres: Animation, Children's, Comedy.", so feeding it verbatim would let the
tagger copy its evaluation labels. ``prompt_description`` drops sentences that name a category
label or repeat the title. Embeddings (``jobs.tagging.generate.pooled_states``) read the full
catalog text instead: there the categories are legitimate input, not a target.

Deliberately left out: decoding (``jobs.tagging.generate``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from llm_rerank.prompt import CLOSE, OPEN, sanitise_title
from llm_rerank.template import DEFAULT, PromptTemplate

PROMPT_VERSION = "t1"
PREFILL = '{"genres": ['
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def prompt_description(title: str, text: str, categories: Sequence[str], max_chars: int) -> str:
    """Catalog text minus the title and any sentence naming a category or a 'Genres:' list.

    >>> prompt_description("Heat (1995)", "Heat (1995). Genres: Action, Crime. A cop hunts a thief.",
    ...                    ["Action", "Crime"], 100)
    'A cop hunts a thief.'
    """
    lowered = [c.lower() for c in categories]
    kept = []
    for sentence in _SENTENCE.split(str(text or "").strip()):
        s = sentence.strip()
        low = s.lower()
        if not s or s.rstrip(".") == title.strip() or low.startswith(("genres:", "categories:")):
            continue
        if any(re.search(rf"\b{re.escape(c)}\b", low) for c in lowered):
            continue
        kept.append(s)
    return " ".join(kept)[:max_chars].rstrip()


def render_prompt(tokenizer: Any, domain: str, title: str, description: str, title_chars: int,
                  template: PromptTemplate = DEFAULT) -> str:
    """Full prompt text for one item, assistant prefill included."""
    special = [t for t in getattr(tokenizer, "all_special_tokens", []) if t]
    clean_title = sanitise_title(title, title_chars, special)
    clean_desc = sanitise_title(description, 4 * title_chars, special) if description else ""
    system = template.tagging_system_text(domain)
    user = f"{domain.capitalize()}: {OPEN}{clean_title}{CLOSE}\n"
    if clean_desc:
        user += f"Description: {OPEN}{clean_desc}{CLOSE}\n"
    user += template.render("tagging_request", domain)
    if getattr(tokenizer, "chat_template", None):
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        head = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    else:
        head = f"{system}\n\n### User\n{user}\n\n### Assistant\n"
    return head + PREFILL


def target_completion(known: dict[str, Any]) -> str:
    """The text after ``PREFILL`` that adaptation teaches, for the fields the catalog knows.

    Fields are emitted in schema order and the target stops after the last known one, so the
    model is never taught a made-up value for a field the catalog lacks.

    >>> target_completion({"genres": ["Comedy", "Drama"]})
    '"Comedy", "Drama"], '
    >>> target_completion({"genres": ["Drama"], "audience": "teen"})
    '"Drama"], "audience": "teen", '
    """
    if not known.get("genres"):
        raise ValueError("target_completion: 'genres' must be a non-empty list")
    full = json.dumps({k: known[k] for k in ("genres", "audience", "risk_flags") if k in known})
    return full[len(PREFILL):-1] + ", "
