"""``recsys.names``: the one rule for what ids and version names may hold."""

from __future__ import annotations

import re
import sys
import unicodedata

import pytest
from pydantic import BaseModel, Field, ValidationError

from recsys.names import FORBIDDEN, NAME_PATTERN, forbidden_character


def test_every_control_and_format_character_is_forbidden_and_nothing_else_assigned() -> None:
    forbidden = re.compile(f"[{FORBIDDEN}]")
    for cp in range(sys.maxunicode + 1):
        ch = chr(cp)
        category = unicodedata.category(ch)
        if category in ("Cc", "Cf"):
            assert forbidden.fullmatch(ch), f"U+{cp:04X} ({category}) is not refused"
        elif forbidden.fullmatch(ch):
            # a newer Unicode may class a code point Cf that this Python's unicodedata does not know yet
            assert category == "Cn", f"U+{cp:04X} ({category}) is refused but is neither control nor format"


class _Id(BaseModel):
    id: str = Field(pattern=NAME_PATTERN)


@pytest.mark.parametrize("name", ["sku-1", "Amélie (2001)", "東京", "a b", "🙂", "ünïcödé/ok:1"])
def test_printable_names_pass_the_python_and_the_pydantic_check(name: str) -> None:
    assert forbidden_character(name) is None
    assert _Id(id=name).id == name


@pytest.mark.parametrize(("name", "why"), [
    ("a\x00", "a control character ('\\x00' at 1)"),
    ("a\x85b", "a control character ('\\x85' at 1)"),
    ("\ufeffu1", "an invisible format character (U+FEFF ZERO WIDTH NO-BREAK SPACE at 0)"),
    ("al\u00adice", "an invisible format character (U+00AD SOFT HYPHEN at 2)"),
    ("x\U000e0041", "an invisible format character (U+E0041 TAG LATIN CAPITAL LETTER A at 1)"),
])
def test_forbidden_names_say_which_character_and_where_in_both_engines(name: str, why: str) -> None:
    assert forbidden_character(name) == why
    with pytest.raises(ValidationError):  # pydantic-core's Rust regex reads the same escapes
        _Id(id=name)
