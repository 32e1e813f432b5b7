"""Any interaction log in the canonical column names, as CSV or Parquet -> ``Dataset``.

Files in one directory (each ``.csv`` or ``.parquet``):

- ``interactions``: ``user_id, item_id[, rating], timestamp``. No rating column means
  implicit feedback (every event rated ``common.IMPLICIT_RATING``). A timestamp is required
  (unix seconds or ISO-8601) because the leave-one-out protocol orders events by time.
- ``items`` (optional): ``item_id[, title, text, categories, audience, risk_level, year,
  attributes]``; categories as a '|'-joined string or a list; an empty text is built from the
  title and categories. Columns outside the schema are kept in the ``attributes`` JSON. When
  given, every interaction's item must be in it (a typo is an error, not a new item); without
  it the items are those the log names, each titled by its id (no content for the item tower
  or the LLM to read, so a new item cannot be recommended before its first interaction).
- ``users`` (optional): ``user_id[, age, gender, occupation, zip, risk_tolerance,
  attributes]``, extra columns likewise. Without it the users table holds ids only.

Deliberately left out: MovieLens layouts (``movielens``, ``movielens_csv``), k-core filtering.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from offline.loaders import checks, common
from offline.loaders.reading import LINE, Table, find_table_file, read_table
from offline.schema import (
    AUDIENCES,
    INTERACTION_COLUMNS,
    ITEM_COLUMNS,
    RISK_LEVELS,
    USER_COLUMNS,
    DataError,
    Dataset,
)
from recsys.atomic import json_default
from recsys.names import forbidden_character

log = logging.getLogger(__name__)


def load_generic(directory: Path) -> Dataset:
    directory = Path(directory)
    items_path = find_table_file(directory, "items")
    items = _items(read_table(items_path, ("item_id",))) if items_path else None
    users_path = find_table_file(directory, "users")
    users = _users(read_table(users_path, ("user_id",))) if users_path else None
    table = read_table(_need(directory, "interactions"), ("user_id", "item_id"))
    if not table.has("timestamp"):
        raise DataError(
            f"{table.file}: no 'timestamp' column (unix seconds or ISO-8601); "
            "the evaluation protocol needs each user's events in time order"
        )
    if ignored := [c for c in table.rows.columns if c not in INTERACTION_COLUMNS and c != LINE]:
        log.warning("%s: column(s) %s not read: an event is user_id, item_id[, rating], timestamp, and every "
                    "row counts as one positive (filter impressions or other event types out first)",
                    table.file, ignored)
    events = common.interactions(
        table, items=None if items is None else items["item_id"], items_file=items_path.name if items_path else "",
        users=None if users is None else users["user_id"], users_file=users_path.name if users_path else "",
    )
    return Dataset(directory.name, events, common.items_seen(events) if items is None else items,
                   common.users_seen(events) if users is None else users)


def _need(directory: Path, stem: str) -> Path:
    path = find_table_file(directory, stem)
    if path is None:
        raise DataError(f"{directory}: neither {stem}.csv nor {stem}.parquet found")
    return path


def _items(table: Table) -> pd.DataFrame:
    checks.require_file_rows(table)
    item_id = checks.ids(table, "item_id", "item id")
    checks.unique(table, item_id, "item id")
    titles = item_id
    if table.has("title"):
        given = checks.text(table, "title")
        titles = given.where(given != "", item_id)  # an untitled item is shown by its id
    categories = _categories(table) if table.has("categories") else [[] for _ in range(len(table))]
    text = checks.text(table, "text") if table.has("text") else pd.Series([""] * len(table))
    text = [t or common.describe(title, cats) for t, title, cats in zip(text, titles, categories, strict=True)]
    out = pd.DataFrame({"item_id": item_id, "title": titles, "text": text, "categories": categories})
    if table.has("audience"):
        out["audience"] = checks.choice(table, "audience", AUDIENCES, "audience")
    if table.has("risk_level"):
        out["risk_level"] = checks.numbers(table, "risk_level", "risk level", integer=True,
                                           low=min(RISK_LEVELS), high=max(RISK_LEVELS), allow_empty=True)
    if table.has("year"):
        out["year"] = checks.numbers(table, "year", "year", integer=True, allow_empty=True)
    out["attributes"] = _attributes(table, ITEM_COLUMNS)
    return out


def _users(table: Table) -> pd.DataFrame:
    checks.require_file_rows(table)
    user_id = checks.ids(table, "user_id", "user id")
    checks.unique(table, user_id, "user id")
    out = pd.DataFrame({"user_id": user_id})
    if table.has("age"):
        out["age"] = checks.numbers(table, "age", "age", integer=True, low=0, high=130, allow_empty=True)
    for col in ("gender", "occupation", "zip"):
        if table.has(col):
            values = checks.text(table, col)
            out[col] = values.astype(object).where(values != "", None)
    if table.has("risk_tolerance"):
        out["risk_tolerance"] = checks.numbers(table, "risk_tolerance", "risk tolerance", integer=True,
                                               low=min(RISK_LEVELS), high=max(RISK_LEVELS), allow_empty=True)
    out["attributes"] = _attributes(table, USER_COLUMNS)
    return out


def _categories(table: Table) -> list[list[str]]:
    """'A|B' strings or lists of names (Parquet) -> lists of non-empty stripped names; an empty
    value (None, NaN) has none. A cell written as a JSON list (``["Drama", "Horror"]``, as some
    exports write lists into CSV) is read as that list, never as one category named with brackets
    and quotes; one written as a JSON string (``"Drama|Horror"``, quotes included) as that string; a
    name given twice counts once. Anything else (a struct, a number, a nested list, a name holding a control or
    invisible character) is a DataError naming the row, not a silent ``[]`` or a category spelled
    like a Python dict."""
    out: list[list[str]] = []
    for pos, v in enumerate(table.rows["categories"]):
        if isinstance(v, str) and v.strip().startswith("["):
            v = _json_cell(table, pos, v, list)
        elif isinstance(v, str) and len(v.strip()) > 1 and v.strip()[0] == v.strip()[-1] == '"':
            v = _json_cell(table, pos, v.strip(), str)
        if isinstance(v, str):
            parts: Sequence[object] = v.split("|")
        elif isinstance(v, (list, tuple, np.ndarray)):
            parts = list(v)
            if bad := next((p for p in parts if not isinstance(p, (str, int, np.integer)) or isinstance(p, bool)),
                           None):
                raise DataError(f"{table.where(pos)}: categories must be names (strings), got "
                                f"{type(bad).__name__} {checks.short(bad)} in the list")
        elif v is None or (isinstance(v, float) and np.isnan(v)):
            parts = []
        else:
            raise DataError(f"{table.where(pos)}: categories must be a '|'-joined string or a list of names, "
                            f"got {type(v).__name__} {checks.short(v)}")
        names = list(dict.fromkeys(str(p).strip() for p in parts if str(p).strip()))  # a repeat counts once
        if bad := next((n for n in names if forbidden_character(n)), None):
            raise DataError(f"{table.where(pos)}: category {bad!r} contains {forbidden_character(bad)}")
        out.append(names)
    return out


def _json_cell(table: Table, pos: int, cell: str, kind: type) -> Any:
    """A categories cell written as JSON: a list of names (it opens with '[') or a string (quoted twice by
    an exporter: ``"Drama|Horror"`` with its quotes, whose names must not keep a quote a rule would never
    match); a DataError saying how to write it when it is not that JSON."""
    try:
        value = json.loads(cell)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, kind):
        looks = "starts like a JSON list but is not one" if kind is list else "is quoted but is no JSON string"
        raise DataError(f"{table.where(pos)}: categories {checks.short(cell)} {looks}; write names joined by '|' "
                        "(Drama|Horror) or a JSON list of strings")
    return value


def _attributes(table: Table, schema_columns: Sequence[str]) -> list[str]:
    """JSON per row: the ``attributes`` column (a JSON object) merged with non-schema columns."""
    extra = [c for c in table.rows.columns if c not in schema_columns and c != LINE]
    given = checks.text(table, "attributes") if table.has("attributes") else pd.Series([""] * len(table))
    out = []
    for pos, raw in enumerate(given):
        try:
            attrs = json.loads(raw) if raw else {}
        except json.JSONDecodeError as exc:
            raise DataError(f"{table.where(pos)}: attributes is not valid JSON ({exc.msg})") from exc
        if not isinstance(attrs, dict):
            raise DataError(f"{table.where(pos)}: attributes must be a JSON object, got {type(attrs).__name__}")
        for col in extra:
            value = table.rows[col].iat[pos]
            if not checks.is_missing(value):
                attrs[col] = value  # a list column's array as a list, not its printed "['x' 'y']"
        out.append(json.dumps(attrs, default=json_default))
    return out
