"""Category cells and the characters an id or category may hold, as the generic loader reads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from offline.loaders import load_dataset
from offline.schema import DataError
from tests.offline.test_loaders_csv import write_generic

HEAD = "item_id,title,categories\n"
INTERACTIONS = "user_id,item_id,timestamp\nx,a,1\nx,b,2\n"


def categories_of(tmp_path: Path, rows: str) -> list[list[str]]:
    data = load_dataset(write_generic(tmp_path / "g", **{"items.csv": HEAD + rows, "interactions.csv": INTERACTIONS}))
    return [list(c) for c in data.items["categories"]]


def test_categories_are_pipe_separated_and_a_json_list_cell_is_read_as_a_list(tmp_path: Path) -> None:
    rows = 'a,Alpha,Drama|Horror\nb,Beta,"[""Drama"", ""Horror""]"\n'
    assert categories_of(tmp_path, rows) == [["Drama", "Horror"], ["Drama", "Horror"]]


def test_a_cell_quoted_twice_and_a_repeated_name_read_as_plain_names(tmp_path: Path) -> None:
    # an exporter that quotes twice leaves "Drama|Horror" with its quotes: no category may carry one,
    # or a rule on Horror would never match the item
    rows = 'a,Alpha,"""Drama|Horror"""\nb,Beta,"[""Drama"", ""Drama""]"\n'
    assert categories_of(tmp_path, rows) == [["Drama", "Horror"], ["Drama"]]


@pytest.mark.parametrize(("cell", "says"), [
    ('"[""Drama"", ""Horror"""', "categories '[\"Drama\", \"Horror\"' starts like a JSON list but is not one"),
    ('"[1, [2]]"', "categories must be names (strings), got list [2] in the list"),
    ('"Hor\x07ror"', r"category 'Hor\x07ror' contains a control character ('\x07' at 3)"),
    ('"Drama|Hor\u2028ror"', "category 'Hor\\u2028ror' contains a line break character (U+2028 LINE SEPARATOR at 3)"),
])
def test_a_cell_that_cannot_be_names_is_refused_with_its_line(tmp_path: Path, cell: str, says: str) -> None:
    with pytest.raises(DataError) as err:
        categories_of(tmp_path, f"a,Alpha,Drama\nb,Beta,{cell}\n")
    assert "items.csv line 3: " in str(err.value) and says in str(err.value)


@pytest.mark.parametrize(("user", "says"), [
    ("x\U000e0041", "user id 'x\\U000e0041' contains a tag character outside a subdivision flag "
                    "(U+E0041 TAG LATIN CAPITAL LETTER A at 1)"),
    ("x\u2028y", "user id 'x\\u2028y' contains a line break character (U+2028 LINE SEPARATOR at 1)"),
])
def test_ids_with_stray_tag_or_line_separator_characters_are_refused(tmp_path: Path, user: str, says: str) -> None:
    with pytest.raises(DataError) as err:
        load_dataset(write_generic(tmp_path / "g", **{"interactions.csv": f"user_id,item_id,timestamp\nu,a,1\n{user},b,2\n"}))
    assert f"interactions.csv line 3: {says}" in str(err.value)


def test_a_flag_of_tag_characters_is_an_id(tmp_path: Path) -> None:
    scotland = "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f"
    data = load_dataset(write_generic(tmp_path / "g", **{
        "interactions.csv": f"user_id,item_id,timestamp\n{scotland},a,1\nu,b,2\n"}))
    assert scotland in set(data.interactions["user_id"])


@pytest.mark.parametrize(("ts", "hint"), [
    ("11600000000", ""),  # 2337-08-... in seconds: out of range, nothing like milliseconds
    ("1609459200000", " (milliseconds? divide by 1000)"),
    ("1609459200000000", " (microseconds? divide by 1000000)"),
])
def test_the_unit_hint_fires_only_for_values_that_read_as_a_finer_unit(tmp_path: Path, ts: str, hint: str) -> None:
    with pytest.raises(DataError) as err:
        load_dataset(write_generic(tmp_path / "g", **{"interactions.csv": f"user_id,item_id,timestamp\nx,a,{ts}\n"}))
    assert str(err.value).endswith(f"(unix seconds -9223372036..9223372036){hint}")
