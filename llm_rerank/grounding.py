"""Is a written reason grounded? The check every reason passes before it is served, and the template
reason that replaces one that fails.

A reason may name only what the evidence holds (``Evidence``): titles from the user's history and
the item's own title, the item's categories (or those of the user's history, which the reason may
say the user likes), and years its title or data carry. ``ItemFacts.check`` finds what a reason
names by matching it against the whole catalog:

- titles: each catalog title in two forms, its full name and its head (before a bracket, colon or
  comma), normalised ("Lion King, The (1994)" reads "the lion king"), matched word for word with
  the longest name winning; a name counts only written as one (a capital letter in a word other
  than an article, and a one-word name past the reason's first word: "Heat" the film, not "heat"). A named catalog item that is neither in the
  history nor the item itself fails the reason;
- categories: every catalog category, singular or plural ("comedies" names Comedy); one that is
  neither the item's nor a history item's fails the reason;
- years: a 19xx/20xx year the item's data and the history titles do not carry fails the reason;
- form: fewer than ``MIN_WORDS`` words, more than ``max_words``, or no sentence end (a reason the
  token budget cut off) fails it.

``template_reason`` writes the reason from the same evidence when the model's fails, overruns or
errors ("Because you watched X and Y", "Popular with new visitors"), worded with the catalog's
verb (``verb_for``: watched, read, listened to, bought). It passes the same check by construction.

Deliberately left out: writing reasons with the model (``llm_rerank.explain``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

_TOKEN = re.compile(r"[A-Za-z0-9]+(?:'[A-Za-z]+)?")
_YEAR = re.compile(r"\b(?:19|20)\d\d\b")
_TRAILING_YEAR = re.compile(r"\s*\((?:19|20)\d\d\)\s*$")
_ARTICLE_SUFFIX = re.compile(r"^(.*), (The|A|An|Les|La|Le|Il|Das|Der|Die|El)$", re.IGNORECASE)
_HEAD_CUT = re.compile(r"\s[(\[]|[:,;]\s| - ")
_WATCHED = ("movie", "film", "show", "video", "series", "episode", "anime")
_LISTENED = ("song", "album", "track", "podcast", "music")
_ARTICLES = frozenset({"the", "a", "an"})
MIN_WORDS = 4


def verb_for(domain: str) -> str:
    """The past-tense verb of what users did with items of ``domain``.

    >>> verb_for("movie"), verb_for("book"), verb_for("product")
    ('watched', 'read', 'bought')
    """
    d = domain.lower()
    if any(w in d for w in _WATCHED):
        return "watched"
    if "book" in d:
        return "read"
    return "listened to" if any(w in d for w in _LISTENED) else "bought"


def _stem(word: str) -> str:
    """A crude singular, the same on both sides of a match: comedies -> comedy, thrillers -> thriller."""
    w = word.lower().replace("'", "")
    if len(w) > 4 and w.endswith("ies"):
        return w[:-3] + "y"
    if len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
        return w[:-1]
    return w


def _tokens(text: str) -> list[tuple[str, str]]:
    """(stem, original spelling) of each word of ``text``."""
    return [(_stem(m.group()), m.group()) for m in _TOKEN.finditer(text)]


def display_title(title: str, max_chars: int = 60) -> str:
    """A title as a reason names it: "Lion King, The (1994)" -> "The Lion King (1994)", cut at a word.

    >>> display_title("Lion King, The (1994)")
    'The Lion King (1994)'
    """
    text = " ".join(str(title).split())
    year = _TRAILING_YEAR.search(text)
    core = text[: year.start()] if year else text
    moved = _ARTICLE_SUFFIX.match(core)
    if moved:
        core = f"{moved.group(2)} {moved.group(1)}"
    text = core + (f" ({year.group().strip(' ()')})" if year else "")
    if len(text) > max_chars:
        text = text[:max_chars].rsplit(" ", 1)[0].rstrip(",;:-")
    return text


def title_forms(title: str) -> list[tuple[str, ...]]:
    """The word sequences that name ``title`` in a reason: its full name and its head."""
    core = display_title(title, 10_000)
    core = _TRAILING_YEAR.sub("", core)
    forms = {tuple(s for s, _ in _tokens(core))}
    head = _HEAD_CUT.split(core, maxsplit=1)[0]
    if len(head) >= 8 and len(head.split()) >= 2:
        forms.add(tuple(s for s, _ in _tokens(head)))
    return [f for f in forms if f and (len(f) > 1 or len(f[0]) >= 3)]


def _written_as_name(words: Sequence[str], first: bool) -> bool:
    """Whether ``words`` (as written) read as a name rather than common words (``PhraseIndex.find``)."""
    if len(words) == 1 and first:
        return False
    return any(any(ch.isupper() for ch in w) for w in words if w.lower() not in _ARTICLES)


class PhraseIndex:
    """Word-sequence phrases -> the ids they name; ``find`` returns what a text names, longest first."""

    def __init__(self, phrases: Iterable[tuple[tuple[str, ...], Any]]):
        self.index: dict[tuple[str, ...], set[Any]] = {}
        for phrase, ident in phrases:
            self.index.setdefault(phrase, set()).add(ident)
        self.lengths = sorted({len(p) for p in self.index}, reverse=True)

    def find(self, text: str, *, proper: bool = False) -> set[Any]:
        """Ids named in ``text``; with ``proper`` a phrase counts only written as a name: a word of it
        other than an article holds a capital letter, and a one-word phrase is past the first word
        ("The Game" the film, not "the game"; "Heat", not "heat" nor a sentence's first word)."""
        toks = _tokens(text)
        stems = [s for s, _ in toks]
        found: set[Any] = set()
        i = 0
        while i < len(toks):
            for n in self.lengths:
                phrase = tuple(stems[i : i + n])
                if len(phrase) < n or phrase not in self.index:
                    continue
                if proper and not _written_as_name([w for _, w in toks[i : i + n]], first=i == 0):
                    continue
                found |= self.index[phrase]
                i += n - 1
                break
            i += 1
        return found


@dataclass(frozen=True)
class Evidence:
    """What one item's reason may draw on (``llm_rerank.explain.EvidenceBuilder`` fills it)."""

    item: int
    title: str
    categories: tuple[str, ...]
    year: int | None
    text: str
    channels: tuple[str, ...]  # the recall channels that found it ("two_tower", "covisit", "popularity", ...)
    neighbours: tuple[int, ...]  # history items nearest to it by co-visitation, nearest first
    history: tuple[int, ...]  # the user's history, oldest first
    recent: tuple[int, ...]  # the history window the prompt shows, oldest first


class ItemFacts:
    """The catalog as the grounding check reads it: titles, categories and years per item."""

    def __init__(self, titles: Sequence[str], categories: Sequence[Sequence[str]],
                 years: Sequence[int | None], texts: Sequence[str]):
        self.titles = np.asarray([str(t) for t in titles], dtype=object)
        self.categories = [tuple(str(c) for c in cats) for cats in categories]
        self.years = [None if y is None else int(y) for y in years]
        self.texts = [str(t) for t in texts]
        if not len(self.titles) == len(self.categories) == len(self.years) == len(self.texts):
            raise ValueError("ItemFacts: titles, categories, years and texts must have one row per item")
        self.title_index = PhraseIndex((form, i) for i, t in enumerate(self.titles) for form in title_forms(t))
        self.category_index = PhraseIndex((tuple(s for s, _ in _tokens(c)), c)
                                          for cats in self.categories for c in cats if _tokens(c))

    @classmethod
    def from_items(cls, items: Any) -> ItemFacts:
        """From a split's items table (``offline.schema``: title, and categories, year, text when present)."""
        n = len(items)
        cats = items["categories"].tolist() if "categories" in items else [[]] * n
        years = items["year"].astype("Float64").tolist() if "year" in items else [None] * n
        texts = items["text"].tolist() if "text" in items else [""] * n
        return cls(items["title"].astype(str).tolist(),
                   [list(c) if isinstance(c, (list, tuple, np.ndarray)) else [] for c in cats],
                   [int(y) if isinstance(y, float) and y == y else None for y in years],
                   [t if isinstance(t, str) else "" for t in texts])

    def __len__(self) -> int:
        return len(self.titles)

    def check(self, reason: str, ev: Evidence, max_words: int) -> list[str]:
        """What is wrong with ``reason`` for ``ev`` (empty: grounded)."""
        problems = []
        n_words = len(reason.split())
        if n_words < MIN_WORDS:
            return [f"has {n_words} words, fewer than {MIN_WORDS}: says no why"]
        if n_words > max_words:
            problems.append(f"has {n_words} words, more than {max_words}")
        if not reason.rstrip("\"')»").endswith((".", "!", "?")):
            problems.append("is cut off (no sentence end)")
        allowed = {*ev.history, ev.item}
        for item in sorted(self.title_index.find(reason, proper=True) - allowed):
            problems.append(f"names {display_title(self.titles[item])!r}, which is not in the user's history")
        known = {c for i in (ev.item, *ev.history) for c in self.categories[i]}
        for cat in sorted(self.category_index.find(reason) - known):
            problems.append(f"claims the category {cat!r}, which neither the item nor the history has")
        years = {str(y) for i in (ev.item, *ev.history) for y in [self.years[i]] if y is not None}
        years |= {y for i in (ev.item, *ev.history) for y in _YEAR.findall(self.titles[i])}
        for year in sorted(set(_YEAR.findall(reason)) - years):
            problems.append(f"claims the year {year}, which the item's data does not carry")
        return problems


def template_reason(ev: Evidence, facts: ItemFacts, verb: str, domain: str) -> str:
    """The reason written from ``ev`` alone (no model): always grounded."""
    def name(i: int) -> str:
        return display_title(str(facts.titles[i]))

    if ev.neighbours:
        named = [name(i) for i in ev.neighbours[:2]]
        return f"Because you {verb} {' and '.join(named)}."
    if not ev.history:
        return "Popular with new visitors."
    shared = [c for c in ev.categories if c]
    for i in reversed(ev.history):
        common = [c for c in shared if c in facts.categories[i]]
        if common and len(common[0]) <= 30:
            return f"Because you {verb} {common[0]} {domain}s such as {name(i)}."
    if "popularity" in ev.channels and len(ev.channels) == 1:
        return f"Popular with other visitors who {verb} {domain}s like yours."
    return f"Picked from what you {verb} recently, such as {name(ev.history[-1])}."
