"""What the LLM's prompt says of an item: its title alone, or its title with what the catalog adds.

``llm.item_text`` chooses:

- ``title``: the title, cut by the prompt builder to ``llm.title_chars``. A movie's title (with
  its year) is what the model can know it by.
- ``title_details``: the title cut to ``llm.title_chars``, then in parentheses the end of its
  category path (the most specific levels; a root shared by the whole catalog says nothing) and
  what the catalog's ``text`` holds beyond the title and the categories (a brand in the UniSRec
  preparation of Amazon reviews, ``"<title>. <categories>. <brand>. "``), both cut to
  ``llm.detail_chars`` together. A product's title alone is often cut before it says what the
  product is for; its category and brand say it in a few tokens.

The stage (``LLMRerankStage.load``) and the adaptation job (``llm_rerank.adapt``) build their
item texts here, so adapted and served prompts read the same text.

Deliberately left out: sanitising and tokenizing the text (``llm_rerank.prompt``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from llm_rerank.config import LLMConfig

EXTRA_CHARS = 24  # what the text adds beyond title and categories (a brand) is kept to this much


def tail_words(text: str, max_chars: int) -> str:
    """The end of ``text`` in at most ``max_chars`` characters, cut at a word boundary.

    >>> tail_words("Industrial & Scientific Lab Supplies Pipettes", 20)
    'Supplies Pipettes'
    >>> tail_words("Pipettes", 20)
    'Pipettes'
    >>> tail_words("Inspect Inspection & Analysis Borescopes", 22)
    'Analysis Borescopes'
    """
    text = " ".join(str(text).split())
    if len(text) <= max_chars:
        return text
    cut = text[len(text) - max_chars:]
    cut = cut.split(" ", 1)[1] if " " in cut else cut
    return cut.lstrip("&,;:- ")  # a cut level's joining word says nothing


def text_extra(text: str, title: str, categories: Sequence[str]) -> str:
    """What ``text`` says beyond ``title`` and ``categories`` (their separators dropped).

    >>> text_extra("Pipette Tips. Lab Supplies Pipettes. Eppendorf. ", "Pipette Tips", ["Lab Supplies Pipettes"])
    'Eppendorf'
    >>> text_extra("", "Toy Story (1995)", ["Animation"])
    ''
    """
    rest = " ".join(str(text).split())
    title = " ".join(str(title).split())
    if title and rest.startswith(title):
        rest = rest[len(title):]
    for category in categories:
        if category:
            rest = rest.replace(" ".join(str(category).split()), " ")
    return " ".join(rest.replace(".", " ").split()).strip(" ,;:")


def item_label(title: str, text: str, categories: Sequence[str], title_chars: int, detail_chars: int) -> str:
    """``title`` cut to ``title_chars``, then ``(category tail; extra)`` in ``detail_chars``.

    >>> item_label("SE TL10 10-Piece Test Lead Set with Alligator Clips",
    ...            "SE TL10 10-Piece Test Lead Set with Alligator Clips. Industrial & Scientific Test, "
    ...            "Measure & Inspect Electrical Testing Test Probes & Leads. SE. ",
    ...            ["Industrial & Scientific Test, Measure & Inspect Electrical Testing Test Probes & Leads"], 30, 40)
    'SE TL10 10-Piece Test Lead Set (Testing Test Probes & Leads; SE)'
    """
    head = " ".join(str(title).split())
    if len(head) > title_chars:  # cut at a word boundary where one is in the second half
        cut = head[:title_chars + 1].rsplit(" ", 1)[0]
        head = (cut if len(cut) > title_chars // 2 else head[:title_chars]).rstrip(" ,;:-")
    extra = text_extra(text, title, categories)[:EXTRA_CHARS].rstrip()
    path = " ".join(str(c) for c in categories if c)
    room = detail_chars - (len(extra) + 2 if extra else 0)
    category = tail_words(path, room) if room > 0 and path else ""
    details = "; ".join(p for p in (category, extra) if p)
    return f"{head} ({details})" if details else head


def item_labels(items: Any, cfg: LLMConfig) -> np.ndarray:
    """The prompt's text of every item of ``items`` (the split's item table), row i = item_idx i."""
    titles = items["title"].to_numpy(dtype=object)
    if cfg.item_text == "title":
        return titles
    texts = items["text"].to_numpy(dtype=object) if "text" in items else np.full(len(titles), "", dtype=object)
    cats = items["categories"].to_numpy(dtype=object) if "categories" in items else np.full(len(titles), None)
    out = [item_label(str(t), "" if _missing(x) else str(x), _category_list(c), cfg.title_chars, cfg.detail_chars)
           for t, x, c in zip(titles, texts, cats, strict=True)]
    return np.asarray(out, dtype=object)


def _missing(value: Any) -> bool:
    """A missing cell: None, or the NaN a DataFrame holds for one."""
    return value is None or (isinstance(value, float) and np.isnan(value))


def _category_list(value: Any) -> list[str]:
    """A categories cell as a list of strings (the split stores an array; a missing cell is empty)."""
    if _missing(value):
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]
