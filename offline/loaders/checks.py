"""Vectorised value checks on a ``Table`` that fail at the first bad row, by line.

Each check parses one column for the whole file at once (pandas), and only when something is
wrong looks up the first offending row to name it: ``"ratings.dat line 3: rating 'x' is not a
number"``. Nothing is dropped or coerced silently: a loader either returns every row or raises.

Deliberately left out: reading files (``offline.loaders.reading``) and domain meaning.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import pandas as pd

from offline.loaders.reading import Table
from offline.schema import DataError


def text(table: Table, column: str) -> pd.Series:
    """The column as str with surrounding whitespace removed (missing values -> "")."""
    col = table.rows[column]
    return col.where(col.notna(), "").astype(str).str.strip()


def ids(table: Table, column: str, what: str) -> pd.Series:
    """Non-empty id strings; ``what`` names the id in messages (e.g. "user id")."""
    out = text(table, column)
    table.fail_first((out == "").to_numpy(), lambda pos: f"empty {what}")
    return out


def numbers(
    table: Table,
    column: str,
    what: str,
    *,
    integer: bool = False,
    low: float | None = None,
    high: float | None = None,
    allow_empty: bool = False,
) -> pd.Series:
    """Parse a numeric column: float64, or Int64 when ``integer``; empty -> <NA> if ``allow_empty``.

    Example: ratings "4", "x" -> DataError("ratings.dat line 2: rating 'x' is not a number").
    """
    raw = text(table, column)
    empty = (raw == "").to_numpy()
    if not allow_empty:
        table.fail_first(empty, lambda pos: f"empty {what}")
    values = pd.to_numeric(raw.where(~empty, None), errors="coerce").astype("float64")
    bad = values.isna().to_numpy() & ~empty
    table.fail_first(bad, lambda pos: f"{what} {raw.iat[pos]!r} is not a number")
    finite = values.to_numpy(dtype=np.float64, na_value=np.nan)
    table.fail_first(np.isinf(finite), lambda pos: f"{what} {raw.iat[pos]!r} is not finite")
    if integer:
        table.fail_first(~empty & (finite != np.round(finite)), lambda pos: f"{what} {raw.iat[pos]!r} is not an integer")
    if low is not None or high is not None:
        lo = -np.inf if low is None else low
        hi = np.inf if high is None else high
        out_of_range = ~empty & ((finite < lo) | (finite > hi))
        table.fail_first(out_of_range, lambda pos: f"{what} {raw.iat[pos]} is outside [{low}, {high}]")
    return values.round().astype("Int64") if integer else values


def timestamps(table: Table, column: str) -> np.ndarray:
    """Unix seconds (int64) from integers/floats, or from ISO-8601 date-times when not numeric."""
    col = table.rows[column]
    if pd.api.types.is_datetime64_any_dtype(col):  # a typed Parquet column
        table.fail_first(col.isna().to_numpy(), lambda pos: "empty timestamp")
        return _unix_seconds(pd.to_datetime(col, utc=True))
    raw = text(table, column)
    table.fail_first((raw == "").to_numpy(), lambda pos: "empty timestamp")
    numeric = pd.to_numeric(raw, errors="coerce")
    if numeric.notna().all():
        return numbers(table, column, "timestamp").to_numpy(dtype=np.float64).astype(np.int64)
    parsed = pd.to_datetime(raw, errors="coerce", utc=True, format="ISO8601")
    table.fail_first(
        parsed.isna().to_numpy(),
        lambda pos: f"timestamp {raw.iat[pos]!r} is neither a number (unix seconds) nor an ISO-8601 date-time",
    )
    return _unix_seconds(parsed)


def _unix_seconds(moments: pd.Series) -> np.ndarray:
    return ((moments - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(seconds=1)).to_numpy(dtype=np.int64)


def unique(table: Table, values: pd.Series, what: str) -> None:
    """No value twice (e.g. an item id defined by two lines)."""
    dup = values.duplicated().to_numpy()
    if dup.any():
        pos = int(np.flatnonzero(dup)[0])
        first = int(np.flatnonzero((values == values.iat[pos]).to_numpy())[0])
        table.fail_first(dup, lambda p: f"duplicate {what} {values.iat[p]!r} (first defined at {table.where(first)})")


def known(table: Table, values: pd.Series, valid: Collection[str] | pd.Index, what: str, source: str) -> None:
    """Every value is defined in ``source`` (e.g. interactions reference only catalog items)."""
    index = valid if isinstance(valid, pd.Index) else pd.Index(list(valid))
    unknown = ~values.isin(index).to_numpy()
    table.fail_first(unknown, lambda pos: f"unknown {what} {values.iat[pos]!r} (not in {source})")


def choice(table: Table, column: str, allowed: Collection[str], what: str) -> pd.Series:
    """Optional categorical values: "" -> None, anything else must be in ``allowed``."""
    raw = text(table, column)
    bad = ~raw.isin(list(allowed)).to_numpy() & (raw != "").to_numpy()
    table.fail_first(bad, lambda pos: f"{what} {raw.iat[pos]!r} is not one of {sorted(allowed)}")
    return raw.astype(object).where(raw != "", None)


def is_missing(value: object) -> bool:
    """None, NaN/<NA> or a blank string (a CSV cell with nothing in it)."""
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, (list, tuple, dict, np.ndarray)):
        return False
    return bool(pd.isna(value))


def require_file_rows(table: Table) -> None:
    if len(table) == 0:
        raise DataError(f"{table.file}: no data rows")
