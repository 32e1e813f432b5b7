"""The anchored reason format: what the model writes for one item and how it becomes a sentence.

A row offers the model numbered *anchors* (``anchors_of``: history items nearest the item by
co-visitation, then the most recent) and the model writes ``{"because": n, "why": "<clause>"}``
(``reason_schema``); ``parse_reason`` reads it, ``render_reason`` turns it into the served
sentence and ``clause_problems`` says what makes a clause unfit to serve. Every name a reason
holds is thus an anchor's, taken from the evidence.

Deliberately left out: the decoding loop, the cache and the grounding check of the whole
sentence (``llm_rerank.explain``, ``llm_rerank.grounding``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from llm_rerank.config import ExplainConfig
from llm_rerank.grounding import Evidence, display_title

TITLE_CHARS = 40  # an anchor's title as a reason names it, cut at a word (``display_title``)
MIN_CLAUSE = 10  # characters of the shortest "why" clause: fewer says no why
MIN_CLAUSE_WORDS = 3  # words of the shortest clause served ("amadeus" names, it does not explain)


def reason_schema(anchors: int, max_chars: int) -> dict[str, Any]:
    """The JSON schema of one row's output: the number of the anchor the reason rests on (1 to
    ``anchors``) and a lowercase clause of ``MIN_CLAUSE`` to ``max_chars`` characters saying why.

    The clause holds letters, spaces, commas, apostrophes and hyphens only, a capital letter at most
    in its first: no title written as a name, no digit, so no year, no full stop, so one sentence.
    """
    clause = f"^[A-Za-z][a-z ,'-]{{{MIN_CLAUSE - 1},{max_chars - 1}}}$"
    return {"type": "object",
            "properties": {"because": {"type": "integer", "minimum": 1, "maximum": anchors},
                           "why": {"type": "string", "pattern": clause}},
            "required": ["because", "why"], "additionalProperties": False}


_CLAUSE = re.compile(r"[A-Za-z][a-z ,'-]*")
_SELF = frozenset({"i", "i'm", "me", "my", "we", "our"})  # the writer speaking of itself ("i am not sure")
ECHO_WORDS = 4  # a run this long of the request's own words is an echo, not a reason


def _echoes(said: list[str], ask: list[str]) -> bool:
    """The clause is all of the request's words, or holds ``ECHO_WORDS`` of them in a row."""
    if " ".join(said) in " ".join(ask):
        return True
    runs = {tuple(ask[i:i + ECHO_WORDS]) for i in range(len(ask) - ECHO_WORDS + 1)}
    return any(tuple(said[i:i + ECHO_WORDS]) in runs for i in range(len(said) - ECHO_WORDS + 1))


_STUTTER = re.compile(r"([a-z]{1,3})\1{3,}")  # "wcwcwcwc": a fragment four times over


def clause_chars(cfg: ExplainConfig) -> int:
    """Characters of the longest "why" clause: with "Because you <verb> <anchor>," about ``max_words``."""
    return cfg.max_words * 3


def anchors_of(ev: Evidence, n: int) -> tuple[int, ...]:
    """The history items a reason may rest on, best first: the item's nearest by co-visitation, then
    the most recent ones of the prompt's window; at most ``n``."""
    return tuple(dict.fromkeys([*ev.neighbours, *reversed(ev.recent)]))[:n]


def render_reason(anchor_title: str, why: str, verb: str) -> str:
    """The served sentence of a row's output.

    >>> render_reason("Lion King, The (1994)", "Another musical adventure with talking animals ,", "watched")
    'Because you watched The Lion King (1994), another musical adventure with talking animals.'
    """
    clause = " ".join(why.replace(" ,", ",").split()).strip(" ,'-")
    clause = clause[:1].lower() + clause[1:]
    return f"Because you {verb} {display_title(anchor_title, TITLE_CHARS)}, {clause}."


_INFLECTIONS = (("ies", "y"), ("es", ""), ("s", ""), ("ed", ""), ("ed", "e"), ("ing", ""), ("ing", "e"),
                ("ly", ""), ("er", ""), ("est", ""))


def known_word(word: str, words: frozenset[str]) -> bool:
    """``word`` is one of ``words`` or a regular inflection of one (a plural, a past, an -ing, an -ly form):
    a tokenizer holds "comedy" as a whole token but rarely "comedies".

    >>> known_word("comedies", frozenset({"comedy"})), known_word("tools", frozenset({"tool"}))
    (True, True)
    >>> known_word("bacabacuad", frozenset({"bacab"}))
    False
    """
    if word in words:
        return True
    return any(word.endswith(end) and len(word) - len(end) + len(base) > 2 and word[:len(word) - len(end)] + base
               in words for end, base in _INFLECTIONS)


def clause_problems(why: str, max_chars: int, words: frozenset[str] | None = None, ask: str = "") -> list[str]:
    """What makes a schema-valid clause unfit to serve: fewer than ``MIN_CLAUSE_WORDS`` words, cut at its
    length limit, degenerate text, a
    word that is neither one of ``words`` (the tokenizer's whole-word tokens and the catalog's words)
    nor a regular inflection of one (``known_word``), a clause that echoes the request ``ask`` (all of it,
    or ``ECHO_WORDS`` of its words in a row), or one in the first person.

    >>> clause_problems("both keep a workshop organised", 75)
    []
    >>> clause_problems("wow, wow, wow, wow", 75)
    ["repeats 'wow'"]
    >>> clause_problems("both are bacabacuad", 75, frozenset({"both", "are"}))
    ["is not a word: 'bacabacuad'"]
    >>> clause_problems("what the two have in common", 75, ask="Say what the two have in common.")
    ['echoes the request']
    >>> clause_problems("dear, the two have in common", 75, ask="Say what the two have in common.")
    ['echoes the request']
    >>> clause_problems("i am not sure about it", 75)
    ['speaks of itself, not of the two items']
    >>> clause_problems("the of to to to", 75)
    ["repeats 'to'"]
    """
    problems = []
    said = re.findall(r"[a-z']+", why.lower())
    if len(said) < MIN_CLAUSE_WORDS:
        problems.append(f"says no why (a clause of fewer than {MIN_CLAUSE_WORDS} words)")
    if said and _echoes(said, re.findall(r"[a-z']+", ask.lower())):
        problems.append("echoes the request")
    if _SELF & set(said):
        problems.append("speaks of itself, not of the two items")
    if words is not None:
        unknown = [w for w in re.findall(r"[a-z]+", why.lower()) if len(w) > 2 and not known_word(w, words)]
        problems += [f"is not a word: {w!r}" for w in dict.fromkeys(unknown)]
    if len(why) >= max_chars - 1:
        problems.append("is cut off (the clause reached its length limit)")
    repeated = sorted({w for w in said if said.count(w) >= 3 and len(w) > 2}
                      | {a for a, b in zip(said, said[1:], strict=False) if a == b})  # "wow wow", "to to"
    problems += [f"repeats {w!r}" for w in repeated]
    if _STUTTER.search(why.lower()):
        problems.append("stutters (a fragment four times over)")
    return problems


def parse_reason(text: str) -> tuple[int, str] | None:
    """(anchor number, why clause) of one row's JSON output; None when it is not a schema-valid document.

    >>> parse_reason('{"because": 2, "why": "another tale of the sea"}')
    (2, 'another tale of the sea')
    >>> parse_reason('{"because": 2, "why": "again, as in Titanic"}') is None
    True
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or set(data) != {"because", "why"}:
        return None
    because, why = data["because"], data["why"]
    if not isinstance(because, int) or isinstance(because, bool) or because < 1 or not isinstance(why, str):
        return None
    if len(why) < MIN_CLAUSE or not _CLAUSE.fullmatch(why):
        return None
    return because, why
