"""The item text of the prompt: titles alone, or titles with the end of the category path and the brand."""

from __future__ import annotations

import numpy as np
import pandas as pd

from llm_rerank.config import LLMConfig
from llm_rerank.item_text import item_label, item_labels, text_extra
from llm_rerank.prompt import PromptBuilder, RequestPrompts
from recsys.contract import Request
from tests.llm_rerank.factories import tiny_llm

AMAZON_TEXT = ("eSUN Bronze filament 1.75mm 0.5kg(1.1lb) Spool for Makerbot, Reprap, UP. Industrial & Scientific "
               "Additive Manufacturing Products 3D Printing Supplies 3D Printing Filament. eSUN. ")
AMAZON_PATH = "Industrial & Scientific Additive Manufacturing Products 3D Printing Supplies 3D Printing Filament"


def _items() -> pd.DataFrame:
    return pd.DataFrame({
        "title": ["eSUN Bronze filament 1.75mm 0.5kg(1.1lb) Spool for Makerbot, Reprap, UP", "Beaker"],
        "text": [AMAZON_TEXT, None], "categories": [np.array([AMAZON_PATH], dtype=object), None]})


def test_a_product_label_keeps_the_most_specific_category_levels_and_the_brand() -> None:
    label = item_label("eSUN Bronze filament 1.75mm 0.5kg(1.1lb) Spool for Makerbot, Reprap, UP", AMAZON_TEXT,
                       [AMAZON_PATH], 28, 40)
    assert label == "eSUN Bronze filament 1.75mm (Supplies 3D Printing Filament; eSUN)"
    assert text_extra(AMAZON_TEXT, "eSUN Bronze filament 1.75mm 0.5kg(1.1lb) Spool for Makerbot, Reprap, UP",
                      [AMAZON_PATH]) == "eSUN"


def test_title_mode_gives_the_titles_unchanged_and_details_mode_survives_missing_cells() -> None:
    items = _items()
    assert item_labels(items, LLMConfig()).tolist() == items["title"].tolist()
    labels = item_labels(items, LLMConfig(item_text="title_details", title_chars=28)).tolist()
    assert labels == ["eSUN Bronze filament 1.75mm (Supplies 3D Printing Filament; eSUN)", "Beaker"]


def test_the_prompt_carries_the_details_whole_and_a_product_history_is_bought() -> None:
    _, tok = tiny_llm()
    cfg = LLMConfig(item_text="title_details", title_chars=28, domain="product")
    labels = item_labels(_items(), cfg)
    builder = PromptBuilder.for_config(tok, cfg)
    parts = RequestPrompts.for_config(builder, labels, cfg).build(
        Request(user_id="u", history=np.array([1])), np.array([0, 1]))
    prefix = tok.decode(parts.prefix)
    body = tok.decode(parts.suffixes[0])
    assert "Recently bought products" in prefix and "watched" not in prefix
    assert f"«{labels[0]}»" in body  # not cut at title_chars: the builder's budget holds the details
    movie = PromptBuilder.for_config(tok, LLMConfig(domain="movie"))
    assert "Recently watched movies" in tok.decode(movie.prefix(["Heat (1995)"], {}))
    unset = PromptBuilder.for_config(tok, LLMConfig())  # no dataset in reach: the generic word
    assert "Recently bought items" in tok.decode(unset.prefix(["Heat (1995)"], {}))
