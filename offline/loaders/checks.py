"""Vectorised value checks on a ``Table`` that fail at the first bad row, by line.

Each check parses one column for the whole file at once (pandas), and only when something is
wrong looks up the first offending row to name it: ``"ratings.dat line 3: rating 'x' is not a
number"``. Nothing is dropped or coerced silently: a loader either returns every row or raises.

Ranges are those the canonical schema can hold exactly: integers below 2**53 in magnitude
(parsed through float64), ratings within float32, timestamps within pandas' nanosecond
datetimes (``TIMESTAMP_MIN``..``TIMESTAMP_MAX`` unix seconds, 1677-09-21..2262-04-11 UTC).

Deliberately left out: reading files (``offline.loaders.reading``) and domain meaning.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from decimal import Decimal

import numpy as np
import pandas as pd

from offline.loaders.reading import Table
from offline.schema import DataError
from recsys.names import FORBIDDEN, MAX_ID_CHARS, TAG_CHARACTERS, WHITESPACE, canonical, forbidden_character

MAX_EXACT_INT = 2**53  # float64 holds every integer below this exactly
FLOAT32_MAX = float(np.finfo(np.float32).max)
TIMESTAMP_MAX = (2**63 - 1) // 10**9  # 2262-04-11 23:47:16 UTC: the last second pandas' datetimes hold
TIMESTAMP_MIN = -TIMESTAMP_MAX  # 1677-09-21 00:12:44 UTC
_TIMESTAMP_RANGE = f"the supported range 1677-09-21..2262-04-11 UTC (unix seconds {TIMESTAMP_MIN}..{TIMESTAMP_MAX})"


def text(table: Table, column: str, what: str | None = None) -> pd.Series:
    """The column as str with surrounding whitespace removed (missing values -> "").

    A typed (Parquet) column may hold any scalar (a string, UTF-8 bytes, a number, a decimal, a
    date: its text; a float column of whole numbers reads as integers, "2139" not "2139.0"); a
    list, struct or map is refused, not turned into its Python repr:
    ``"items.parquet row 2: title must be text, got list ['a']"`` (``what``, default the
    column's name, names the column).
    """
    col = _plain(table.rows[column])
    table.fail_first(_not_scalar(col), lambda pos: f"{what or column} must be text, got {shown(col.iat[pos])}")
    if col.dtype.kind == "f" and _all_whole(col):  # an integer column pandas made float64 by one missing value
        col = _whole_numbers_as_integers(col)
    return _stripped(table, column, col)


def _all_whole(col: pd.Series) -> bool:
    values = col.to_numpy(dtype=np.float64)
    values = values[~np.isnan(values)]
    return bool(np.isfinite(values).all() and (values == np.round(values)).all())


def _id_text(table: Table, column: str, what: str) -> pd.Series:
    """``text`` for an id column: a boolean is refused too, and a whole number (7, 7.0, Decimal("7"))
    is the integer's id "7", since pandas makes an integer column with one missing value float64
    and databases export integer keys as decimals, while the other file's column stays integer."""
    col = _plain(table.rows[column])
    bad = _not_scalar(col) | _booleans(col)
    table.fail_first(bad, lambda pos: f"{what} must be text or a number, got {shown(col.iat[pos])}")
    return _stripped(table, column, _whole_numbers_as_integers(col))


# scalars as pandas infers an object column's values (anything else is checked value by value)
_SCALAR_KINDS = frozenset({"string", "bytes", "integer", "floating", "mixed-integer-float", "decimal", "boolean",
                           "date", "datetime", "datetime64", "time", "timedelta", "period", "empty"})


def _not_scalar(col: pd.Series) -> np.ndarray:
    """Mask of lists, tuples, structs (dicts), sets and arrays: values with no text of their own."""
    if col.dtype.kind != "O" or pd.api.types.infer_dtype(col, skipna=True) in _SCALAR_KINDS:
        return np.zeros(len(col), dtype=bool)
    return np.array([isinstance(v, (list, tuple, dict, set, np.ndarray)) for v in col], dtype=bool)


def _booleans(col: pd.Series) -> np.ndarray:
    if col.dtype.kind == "b":
        return np.ones(len(col), dtype=bool)
    if col.dtype.kind != "O" or pd.api.types.infer_dtype(col, skipna=True) not in ("boolean", "mixed"):
        return np.zeros(len(col), dtype=bool)
    return np.array([isinstance(v, (bool, np.bool_)) for v in col], dtype=bool)


def _whole_numbers_as_integers(col: pd.Series) -> pd.Series:
    if col.dtype.kind == "f" or (col.dtype.kind == "O" and pd.api.types.infer_dtype(col, skipna=True) in (
            "floating", "mixed-integer-float", "decimal", "mixed")):
        return col.astype(object).map(_whole_as_integer)
    return col


def _whole_as_integer(value: object) -> object:
    if isinstance(value, (float, np.floating, Decimal)) and math.isfinite(value) and value == int(value):
        return str(int(value))
    return value


def _raw(table: Table, column: str) -> pd.Series:
    """Any column as stripped str, for parsers that refuse what does not parse (numbers, dates)."""
    return _stripped(table, column, _plain(table.rows[column]))


def _plain(col: pd.Series) -> pd.Series:
    # A categorical (a Parquet dictionary column) cannot take "" as a value, nor can a nullable
    # Int64/boolean: read such columns as objects, which can.
    if isinstance(col.dtype, (np.dtype, pd.StringDtype)):
        return col
    return col.astype(object)


def _stripped(table: Table, column: str, col: pd.Series) -> pd.Series:
    try:
        return col.where(col.notna(), "").astype(str).str.strip(WHITESPACE)
    except UnicodeDecodeError:  # a binary Parquet column: bytes pandas cannot read as UTF-8
        table.fail_first(np.array([_undecodable(v) for v in col]), lambda pos: f"{column} is bytes, not UTF-8 text")
        raise


def shown(value: object) -> str:
    """A value as a message shows it: ``"list ['a', 'b']"``, ``"struct {'x': 1}"``, ``"float 2.5"``."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    kind = "list" if isinstance(value, (list, tuple)) else "struct" if isinstance(value, dict) else type(value).__name__
    return f"{kind} {short(value)}"


def short(value: object) -> str:
    """``repr`` cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _undecodable(value: object) -> bool:
    if not isinstance(value, bytes):
        return False
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def ids(table: Table, column: str, what: str) -> pd.Series:
    """Non-empty id strings without control or invisible format characters, in their one spelling
    (NFC; ``recsys.names``); ``what`` names the id (e.g. "user id")."""
    out = _required(table, _id_text(table, column, what), what)
    bad = out.str.contains(f"[{FORBIDDEN}]", regex=True).to_numpy(dtype=bool)
    tagged = out.str.contains(TAG_CHARACTERS, regex=True).to_numpy(dtype=bool)  # allowed only inside a flag
    bad = bad | tagged & np.fromiter((bool(t) and forbidden_character(v) is not None for v, t in zip(out, tagged, strict=True)),
                                dtype=bool, count=len(out))
    table.fail_first(bad, lambda pos: f"{what} {out.iat[pos]!r} contains {forbidden_character(out.iat[pos])}")
    values = out.tolist()  # plain loops: pandas' map and str.len cost ~10x more on 5M ids
    if not all(v.isascii() for v in values):
        out = pd.Series([canonical(v) for v in values], index=out.index, dtype=object, name=out.name)
        values = out.tolist()
    long = np.fromiter((len(v) > MAX_ID_CHARS for v in values), dtype=bool, count=len(values))  # the API could never name it
    table.fail_first(long, lambda pos: f"{what} {short(out.iat[pos])} is {len(out.iat[pos])} characters long "
                     f"(at most {MAX_ID_CHARS})")
    return out


def nonempty(table: Table, column: str, what: str) -> pd.Series:
    """Non-empty strings (e.g. titles, which may hold any character)."""
    return _required(table, text(table, column, what), what)


def _required(table: Table, out: pd.Series, what: str) -> pd.Series:
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

    An integer must be below ``MAX_EXACT_INT`` in magnitude (larger ones lose digits in float64).
    Example: ratings "4", "x" -> DataError("ratings.dat line 2: rating 'x' is not a number").
    """
    raw = _raw(table, column)
    empty = (raw == "").to_numpy()
    if not allow_empty:
        table.fail_first(empty, lambda pos: f"empty {what}")
    values = pd.to_numeric(raw.where(~empty, None), errors="coerce").astype("float64")
    bad = values.isna().to_numpy() & ~empty
    table.fail_first(bad, lambda pos: f"{what} {raw.iat[pos]!r} is not a number")
    finite = values.to_numpy(dtype=np.float64, na_value=np.nan)
    table.fail_first(np.isinf(finite), lambda pos: f"{what} {raw.iat[pos]!r} is not finite")
    if integer:
        too_large = ~empty & (np.abs(finite) >= MAX_EXACT_INT)
        table.fail_first(too_large, lambda pos: f"{what} {raw.iat[pos]!r} is too large (an integer must be below 2**53)")
        table.fail_first(~empty & (finite != np.round(finite)), lambda pos: f"{what} {raw.iat[pos]!r} is not an integer")
    if low is not None or high is not None:
        lo = -np.inf if low is None else low
        hi = np.inf if high is None else high
        out_of_range = ~empty & ((finite < lo) | (finite > hi))
        table.fail_first(out_of_range, lambda pos: f"{what} {raw.iat[pos]} is outside [{low}, {high}]")
    return values.round().astype("Int64") if integer else values


def float32s(table: Table, column: str, what: str) -> np.ndarray:
    """``numbers`` stored as float32: a value float32 cannot hold is refused, never turned into inf."""
    values = numbers(table, column, what).to_numpy(dtype=np.float64)
    table.fail_first(np.abs(values) > FLOAT32_MAX,
                     lambda pos: f"{what} {_raw(table, column).iat[pos]!r} is too large (float32 holds at most 3.4e38)")
    return values.astype(np.float32)


_ZONED = r"[T ]\d[^T]*?(?:Z|[+-]\d{1,2}(?::?\d{2})?)$"  # a time (basic or extended), then Z or an offset


def timestamps(table: Table, column: str) -> np.ndarray:
    """Unix seconds (int64) from whole numbers, or from ISO-8601 date-times when not numeric.

    A fractional number of seconds is refused (the schema keeps whole seconds and the README
    says unix seconds: round them before loading if that is meant); an ISO-8601 date-time's
    fraction of a second is floored. Outside ``TIMESTAMP_MIN``..``TIMESTAMP_MAX`` is refused,
    as is a column mixing unix seconds and ISO-8601, or date-times with a time zone and without
    (the naive ones would be taken as UTC).
    """
    col = table.rows[column]
    if pd.api.types.is_datetime64_any_dtype(col):  # a typed Parquet column
        table.fail_first(col.isna().to_numpy(), lambda pos: "empty timestamp")
        seconds = _unix_seconds(pd.to_datetime(col, utc=True))
        _in_range(table, seconds, lambda pos: str(col.iat[pos]), numeric=False)
        return seconds
    raw = _raw(table, column)
    table.fail_first((raw == "").to_numpy(), lambda pos: "empty timestamp")
    numeric = pd.to_numeric(raw, errors="coerce")
    if numeric.notna().all():
        values = numbers(table, column, "timestamp").to_numpy(dtype=np.float64)
        _in_range(table, values, lambda pos: raw.iat[pos], numeric=True)
        table.fail_first(values != np.floor(values),
                         lambda pos: f"timestamp {raw.iat[pos]!r} is not a whole number of seconds")
        return values.astype(np.int64)
    if numeric.notna().any():  # "20210101" reads as seconds alone, as a date among dates: refuse to guess
        first_date = int(np.flatnonzero(numeric.isna().to_numpy())[0])
        table.fail_first(numeric.notna().to_numpy(), lambda pos: (
            f"timestamp {raw.iat[pos]!r} is a number (unix seconds) but {table.where(first_date)} holds "
            f"{raw.iat[first_date]!r}; use one form (unix seconds or ISO-8601) throughout"))
    text = raw.str.strip().str.replace(r"(?<=\d)z$", "Z", regex=True)  # RFC 3339 allows a lowercase z
    parsed = pd.to_datetime(text, errors="coerce", utc=True, format="ISO8601")
    table.fail_first(
        parsed.isna().to_numpy(),
        lambda pos: f"timestamp {raw.iat[pos]!r} is neither a number (unix seconds) nor an ISO-8601 date-time",
    )
    zoned = text.str.contains(_ZONED, regex=True).to_numpy()
    if zoned.any() and not zoned.all():  # naive ones would be read as UTC: hours apart, events reordered
        first = int(np.flatnonzero(zoned)[0])
        table.fail_first(~zoned, lambda pos: (
            f"timestamp {raw.iat[pos]!r} has no time zone but {table.where(first)} holds {raw.iat[first]!r}; "
            "give every ISO-8601 date-time a zone (Z or +hh:mm) or none"))
    seconds = _unix_seconds(parsed)
    _in_range(table, seconds, lambda pos: raw.iat[pos], numeric=False)
    return seconds


# What a timestamp in a finer unit looks like: since 1973-03-03 in milliseconds (1e11..) or microseconds
# (1e14..), within what pandas holds. A value between the range and 1e11 (year 2337 in seconds) is no such thing.
_FINER_UNITS = ((1_000, "milliseconds", 10**11), (1_000_000, "microseconds", 10**14))


def unit_hint(value: float) -> str:
    """`` (milliseconds? divide by 1000)`` when ``value`` (out of range as seconds) reads as a recent time in
    a finer unit, else "".

    >>> unit_hint(1_609_459_200_000), unit_hint(11_600_000_000), unit_hint(1_609_459_200_000_000)
    (' (milliseconds? divide by 1000)', '', ' (microseconds? divide by 1000000)')
    """
    for factor, unit, low in _FINER_UNITS:
        if low <= value <= TIMESTAMP_MAX * factor:
            return f" ({unit}? divide by {factor})"
    return ""


def _in_range(table: Table, seconds: np.ndarray, shown: Callable[[int], str], *, numeric: bool) -> None:
    def message(pos: int) -> str:
        hint = unit_hint(float(seconds[pos])) if numeric else ""
        return f"timestamp {shown(pos)!r} is outside {_TIMESTAMP_RANGE}{hint}"

    table.fail_first((seconds < TIMESTAMP_MIN) | (seconds > TIMESTAMP_MAX), message)


def _unix_seconds(moments: pd.Series) -> np.ndarray:
    """Seconds since 1970 (floored) in the moments' own resolution, which may span years 1..9999."""
    naive = moments.dt.tz_convert("UTC").dt.tz_localize(None).to_numpy()
    return naive.astype("datetime64[s]").astype(np.int64)


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
    raw = text(table, column, what)
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
