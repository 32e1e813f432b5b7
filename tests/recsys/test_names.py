"""``recsys.names``: the one rule for what ids and version names may hold."""

from __future__ import annotations

import re
import sys
import unicodedata

import pytest
from pydantic import BaseModel, Field, ValidationError

from recsys.names import (
    FORBIDDEN,
    MAX_ID_CHARS,
    NAME_PATTERN,
    canonical,
    forbidden_character,
    id_index,
    id_problem,
)

# the format characters (Cf) that change what is drawn, which real ids hold
DRAWN = {0x200C, 0x200D, *range(0x0600, 0x0606), 0x06DD, 0x070F, 0x0890, 0x0891, 0x08E2, 0x110BD, 0x110CD,
         *range(0x13430, 0x13440), *range(0x1BCA0, 0x1BCA4), *range(0x1D173, 0x1D17B), 0xE0001,
         *range(0xE0020, 0xE0080)}


def test_controls_and_the_format_characters_that_hide_text_are_forbidden_and_nothing_else() -> None:
    forbidden = re.compile(f"[{FORBIDDEN}]")
    for cp in range(sys.maxunicode + 1):
        ch = chr(cp)
        category = unicodedata.category(ch)
        if category in ("Cc", "Zl", "Zp") or (category == "Cf" and cp not in DRAWN):
            assert forbidden.fullmatch(ch), f"U+{cp:04X} ({category}) is not refused"
        elif forbidden.fullmatch(ch):
            # a newer Unicode may class a code point Cf that this Python's unicodedata does not know yet
            assert category == "Cn", f"U+{cp:04X} ({category}) is refused but is neither control nor hidden format"


class _Id(BaseModel):
    id: str = Field(pattern=NAME_PATTERN)


@pytest.mark.parametrize("name", ["sku-1", "Amélie (2001)", "東京", "a b", "🙂", "ünïcödé/ok:1",
                                  "👩\u200d💻", "👨\u200d👩\u200d👧", "🏴\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f",
                                  "می\u200cخواهم", "\u0600\u0661"])
def test_printable_names_pass_the_python_and_the_pydantic_check(name: str) -> None:
    assert forbidden_character(name) is None
    assert _Id(id=name).id == name


@pytest.mark.parametrize(("name", "why"), [
    ("a\x00", "a control character ('\\x00' at 1)"),
    ("a\x85b", "a control character ('\\x85' at 1)"),
    ("\ufeffu1", "an invisible format character (U+FEFF ZERO WIDTH NO-BREAK SPACE at 0)"),
    ("al\u00adice", "an invisible format character (U+00AD SOFT HYPHEN at 2)"),
    ("x\u2067y", "an invisible format character (U+2067 RIGHT-TO-LEFT ISOLATE at 1)"),
    ("a\u2028b", "a line break character (U+2028 LINE SEPARATOR at 1)"),
    ("p\u2029", "a line break character (U+2029 PARAGRAPH SEPARATOR at 1)"),
])
def test_forbidden_names_say_which_character_and_where_in_both_engines(name: str, why: str) -> None:
    assert forbidden_character(name) == why
    with pytest.raises(ValidationError):  # pydantic-core's Rust regex reads the same escapes
        _Id(id=name)


def test_the_module_examples_hold() -> None:
    import doctest

    import recsys.names

    assert doctest.testmod(recsys.names).failed == 0


def test_an_id_index_answers_the_canonical_spelling_and_an_exact_spelling_wins() -> None:
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    assert id_index([nfd, "b"]) == {nfc: 0, nfd: 0, "b": 1}  # a split saved before ids were NFC
    assert id_index([nfd, nfc]) == {nfd: 0, nfc: 1}  # both spellings held: each reaches its own item
    assert id_index([nfc, nfd])[nfc] == 0


def test_canonical_and_id_problem() -> None:
    assert canonical("cafe\u0301") == "caf\u00e9" and canonical("x") == "x"
    assert id_problem("") == "is empty" and id_problem("x" * MAX_ID_CHARS) is None
    assert id_problem("x" * (MAX_ID_CHARS + 1)) == f"is {MAX_ID_CHARS + 1} characters long (at most {MAX_ID_CHARS})"
    assert id_problem("a\u200bb") == "contains an invisible format character (U+200B ZERO WIDTH SPACE at 1)"


@pytest.mark.parametrize(("name", "why"), [
    ("sku\U000e0041", "a tag character outside a subdivision flag (U+E0041 TAG LATIN CAPITAL LETTER A at 3)"),
    ("\U000e0001en", "a tag character outside a subdivision flag (U+E0001 LANGUAGE TAG at 0)"),
    ("🏴\U000e0067\U000e0062\U000e007fx\U000e0062", "a tag character outside a subdivision flag "
     "(U+E0062 TAG LATIN SMALL LETTER B at 5)"),  # after a whole flag, a stray one is still named
    ("🏴\U000e0067\U000e0062", "a tag character outside a subdivision flag (U+E0067 TAG LATIN SMALL LETTER G at 1)"),
])
def test_a_tag_character_outside_a_subdivision_flag_is_refused_where_it_is(name: str, why: str) -> None:
    assert forbidden_character(name) == why
    assert id_problem(name) == f"contains {why}"
