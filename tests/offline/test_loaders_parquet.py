"""Generic Parquet files as pandas writes them: dictionary (categorical) and nullable columns,
a stored pandas index, and values that are not text in a text column."""

from __future__ import annotations

import datetime
import decimal
import json
from pathlib import Path

import pandas as pd
import pytest

from offline.loaders import load_dataset
from offline.schema import DataError


def write_parquet(root: Path, interactions: pd.DataFrame | None = None, items: pd.DataFrame | None = None,
                  users: pd.DataFrame | None = None) -> Path:
    """A generic Parquet directory: two users, items a and b, unless a table is given."""
    root.mkdir(parents=True, exist_ok=True)
    if interactions is None:
        interactions = pd.DataFrame({"user_id": ["u1", "u2"], "item_id": ["a", "b"], "timestamp": [10, 20]})
    if items is None:
        items = pd.DataFrame({"item_id": ["a", "b"], "title": ["Alpha", "Beta"]})
    interactions.to_parquet(root / "interactions.parquet")
    items.to_parquet(root / "items.parquet")
    if users is not None:
        users.to_parquet(root / "users.parquet")
    return root


def test_parquet_categorical_and_nullable_columns_with_a_missing_value_load(tmp_path: Path) -> None:
    # a dictionary-encoded column reads back as pandas `category`, where "" is not a category
    items = pd.DataFrame({"item_id": pd.Series(["a", "b"], dtype="category"),
                          "title": pd.Series(["Alpha", None], dtype="category"),
                          "year": pd.array([1999, None], dtype="Int64")})
    users = pd.DataFrame({"user_id": ["u1", "u2"], "gender": pd.Series([None, "F"], dtype="category"),
                          "occupation": pd.Series(["clerk", None], dtype="category")})
    events = pd.DataFrame({"user_id": pd.Series(["u1", "u2"], dtype="category"), "item_id": ["a", "b"],
                           "timestamp": [10, 20]})
    ds = load_dataset(write_parquet(tmp_path / "pq", events, items, users))
    assert ds.items["title"].tolist() == ["Alpha", "b"]  # a missing title is shown by the id, as in CSV
    assert ds.items["year"].iloc[0] == 1999 and pd.isna(ds.items["year"].iloc[1])
    assert ds.users["gender"].tolist() == [None, "F"]
    assert ds.users["occupation"].tolist() == ["clerk", None]
    assert ds.interactions["user_id"].tolist() == ["u1", "u2"]


@pytest.mark.parametrize(("table", "column", "values", "message"), [
    ("interactions", "user_id", pd.Series(["u1", None], dtype="category"), "interactions.parquet row 2: empty user id"),
    ("interactions", "item_id", pd.Series([None, "b"], dtype="category"), "interactions.parquet row 1: empty item id"),
    ("items", "item_id", pd.Series(["a", None], dtype="category"), "items.parquet row 2: empty item id"),
    ("items", "item_id", pd.array([1, None], dtype="Int64"), "items.parquet row 2: empty item id"),
])
def test_parquet_missing_id_in_a_categorical_or_nullable_column_is_refused(
        tmp_path: Path, table: str, column: str, values: object, message: str) -> None:
    frames = {"interactions": pd.DataFrame({"user_id": ["u1", "u2"], "item_id": ["a", "b"], "timestamp": [10, 20]}),
              "items": pd.DataFrame({"item_id": ["a", "b"], "title": ["Alpha", "Beta"]})}
    frames[table][column] = values
    with pytest.raises(DataError, match=message):
        load_dataset(write_parquet(tmp_path / "pq", frames["interactions"], frames["items"]))


def test_parquet_written_with_a_pandas_index_keeps_the_index_column(tmp_path: Path) -> None:
    items = pd.DataFrame({"item_id": ["a", "b"], "title": ["Alpha", "Beta"]}).set_index("item_id")
    events = pd.DataFrame({"user_id": ["u1", "u2"], "item_id": ["a", "b"], "timestamp": [10, 20]})
    ds = load_dataset(write_parquet(tmp_path / "pq", events.set_index(["user_id", "item_id"]), items))
    assert ds.items["item_id"].tolist() == ["a", "b"] and ds.items["title"].tolist() == ["Alpha", "Beta"]
    assert ds.interactions[["user_id", "item_id"]].to_numpy().tolist() == [["u1", "a"], ["u2", "b"]]
    assert [json.loads(a) for a in ds.items["attributes"]] == [{}, {}]


def test_parquet_unnamed_index_does_not_become_a_column(tmp_path: Path) -> None:
    # a filtered frame's index (0, 2) is stored as a column "__index_level_0__"; a RangeIndex only as metadata
    items = pd.DataFrame({"item_id": ["a", "x", "b"], "title": ["Alpha", "X", "Beta"]}).iloc[[0, 2]]
    ds = load_dataset(write_parquet(tmp_path / "pq", items=items))
    assert ds.items["item_id"].tolist() == ["a", "b"]
    assert [json.loads(a) for a in ds.items["attributes"]] == [{}, {}]
    # an index named like a column is stored as "__index_level_0__" beside that column
    items = pd.DataFrame({"item_id": ["a", "b"], "title": ["Alpha", "Beta"]}).set_index("item_id", drop=False)
    ds = load_dataset(write_parquet(tmp_path / "pq", items=items))
    assert ds.items["item_id"].tolist() == ["a", "b"]
    assert [json.loads(a) for a in ds.items["attributes"]] == [{}, {}]


def test_parquet_missing_column_message_lists_the_index_column(tmp_path: Path) -> None:
    items = pd.DataFrame({"id": ["a", "b"], "title": ["Alpha", "Beta"]}).set_index("id")
    with pytest.raises(DataError, match=r"items.parquet: missing column\(s\) \['item_id'\]; found \['title', 'id'\]"):
        load_dataset(write_parquet(tmp_path / "pq", items=items))


@pytest.mark.parametrize(("table", "column", "values", "message"), [
    ("interactions", "user_id", [["u1"], ["u2"]],
     r"interactions.parquet row 1: user id must be text or a number, got list \['u1'\]"),
    ("interactions", "item_id", [{"id": "a"}, {"id": "b"}],
     r"interactions.parquet row 1: item id must be text or a number, got struct"),
    ("items", "item_id", [True, False], r"items.parquet row 1: item id must be text or a number, got bool True"),
    ("items", "title", [["A"], ["B", "eta"]], r"items.parquet row 1: title must be text, got list \['A'\]"),
    ("items", "text", [None, {"plot": "x"}], r"items.parquet row 2: text must be text, got struct"),
    ("users", "gender", [["F"], None], r"users.parquet row 1: gender must be text, got list"),
    ("users", "occupation", [None, ["clerk"]], r"users.parquet row 2: occupation must be text, got list"),
])
def test_parquet_values_that_are_not_text_in_a_text_column_are_refused(
        tmp_path: Path, table: str, column: str, values: list[object], message: str) -> None:
    # each used to load as its Python repr, e.g. the user id "['u1']"
    frames = {"interactions": pd.DataFrame({"user_id": ["u1", "u2"], "item_id": ["a", "b"], "timestamp": [10, 20]}),
              "items": pd.DataFrame({"item_id": ["a", "b"], "title": ["Alpha", "Beta"]}),
              "users": pd.DataFrame({"user_id": ["u1", "u2"]})}
    frames[table][column] = pd.Series(values, dtype=object)
    with pytest.raises(DataError, match=message):
        load_dataset(write_parquet(tmp_path / "pq", frames["interactions"], frames["items"], frames["users"]))


def test_parquet_numbers_and_utf8_bytes_in_text_columns_are_still_read(tmp_path: Path) -> None:
    events = pd.DataFrame({"user_id": [1.0, 2.0], "item_id": [10, 20], "timestamp": [10, 20]})
    items = pd.DataFrame({"item_id": [10, 20], "title": [b"Caf\xc3\xa9", None]})
    users = pd.DataFrame({"user_id": [1.0, 2.0], "occupation": [7, 8]})
    ds = load_dataset(write_parquet(tmp_path / "pq", events, items, users))
    assert ds.interactions["user_id"].tolist() == ["1", "2"]  # a whole float id is the integer's id
    assert ds.interactions["item_id"].tolist() == ["10", "20"]
    assert ds.items["title"].tolist() == ["Café", "20"]
    assert ds.users["occupation"].tolist() == ["7", "8"]


def test_parquet_extra_list_and_struct_columns_keep_their_shape_in_attributes(tmp_path: Path) -> None:
    # a list column used to land in attributes as numpy's printed array: "['x' 'y']"
    items = pd.DataFrame({"item_id": ["a", "b"], "title": ["Alpha", "Beta"], "tags": [["x", "y"], []],
                          "dims": [{"w": 1.5, "h": 2}, {"w": 3.0, "h": 4}], "stock": [3, 0]})
    ds = load_dataset(write_parquet(tmp_path / "pq", items=items))
    assert [json.loads(a) for a in ds.items["attributes"]] == [
        {"tags": ["x", "y"], "dims": {"w": 1.5, "h": 2}, "stock": 3}, {"tags": [], "dims": {"w": 3.0, "h": 4}, "stock": 0}]


def test_an_integer_id_column_pandas_made_float_still_matches_the_other_file(tmp_path: Path) -> None:
    # one missing title row upstream made pandas store the catalog's integer ids as float64 (7.0):
    # they used to read as "7.0" and every interaction with item 7 was an unknown item id
    events = pd.DataFrame({"user_id": ["u1", "u1", "u2"], "item_id": [7, 8, 7], "timestamp": [10, 20, 30]})
    items = pd.DataFrame({"item_id": pd.Series([7, 8, None]).astype("float64"), "title": ["A", "B", None]})
    items = items.dropna(subset=["item_id"])
    ds = load_dataset(write_parquet(tmp_path / "pq", events, items))
    assert ds.items["item_id"].tolist() == ["7", "8"]
    assert ds.interactions["item_id"].tolist() == ["7", "8", "7"]


def test_parquet_scalars_of_any_type_are_text_and_whole_numbers_are_integer_ids(tmp_path: Path) -> None:
    # database exports store integer keys as decimal(38,0); titles may be dates or numbers: all used
    # to load (a refusal of them was a regression of the first fix for list ids)
    events = pd.DataFrame({"user_id": ["u1", "u2", "u2"], "timestamp": [10, 20, 30],
                           "item_id": [decimal.Decimal("7"), decimal.Decimal("8"), decimal.Decimal("7")]})
    for titles, shown in (([datetime.date(2020, 1, 1), datetime.date(2021, 2, 3)], ["2020-01-01", "2021-02-03"]),
                          ([decimal.Decimal("1.50"), decimal.Decimal("2")], ["1.50", "2.00"]),  # a decimal(3,2) column
                          ([1.5, 2.0], ["1.5", "2.0"])):
        ds = load_dataset(write_parquet(tmp_path / "pq", events, pd.DataFrame({"item_id": [7, 8], "title": titles})))
        assert ds.interactions["item_id"].tolist() == ["7", "8", "7"]
        assert ds.items["title"].tolist() == shown
    events["item_id"] = [7.0, 2.5, 7.0]  # a float id that is not whole keeps its text
    ds = load_dataset(write_parquet(tmp_path / "pq", events, pd.DataFrame({"item_id": ["7", "2.5"]})))
    assert ds.interactions["item_id"].tolist() == ["7", "2.5", "7"]


def test_separator_controls_at_the_ends_of_an_id_are_refused_not_stripped(tmp_path: Path) -> None:
    # Python's str.strip() counts U+001C..U+001F as whitespace: "u1\x1f" used to load as u1 silently
    events = pd.DataFrame({"user_id": ["u1\x1f", "u2"], "item_id": ["a", "b"], "timestamp": [10, 20]})
    items = pd.DataFrame({"item_id": ["a", "b"], "title": [" Alpha\u3000", "Beta"]})
    with pytest.raises(DataError, match=r"interactions.parquet row 1: user id 'u1\\x1f' contains a control character"):
        load_dataset(write_parquet(tmp_path / "pq", events, items))
    events["user_id"] = [" u1\u00a0", "u2"]  # Unicode white space is still padding
    assert load_dataset(write_parquet(tmp_path / "pq", events, items)).interactions["user_id"].tolist() == ["u1", "u2"]


def test_an_integer_attribute_column_pandas_made_float_reads_as_integers(tmp_path: Path) -> None:
    # one missing occupation code made pandas store the column as float64: 1.0 must read "1", not "1.0"
    events = pd.DataFrame({"user_id": ["u1", "u2"], "item_id": ["a", "b"], "timestamp": [10, 20]})
    users = pd.DataFrame({"user_id": ["u1", "u2"], "occupation": [1.0, None], "zip": [2139.0, 94110.0]})
    ds = load_dataset(write_parquet(tmp_path / "pq", events, pd.DataFrame({"item_id": ["a", "b"]}), users))
    assert ds.users["occupation"].tolist() == ["1", None] and ds.users["zip"].tolist() == ["2139", "94110"]
    users["zip"] = [2139.5, 94110.0]  # not all whole: not an integer column, each keeps its text
    ds = load_dataset(write_parquet(tmp_path / "pq", events, pd.DataFrame({"item_id": ["a", "b"]}), users))
    assert ds.users["zip"].tolist() == ["2139.5", "94110.0"]
