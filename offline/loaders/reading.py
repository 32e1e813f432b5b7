"""Raw dataset files -> string tables that remember which line each row came from.

Every loader reads through here so that a malformed file is reported the same way:
``DataError("u.data line 17: expected 4 tab-separated fields, got 3")``. Bytes are decoded
up front (a bad byte is reported by line, not as a codec traceback), then split:

- ``read_delimited``: headerless, unquoted files (MovieLens ``u.*`` and ``*.dat``); the
  field count of every line is checked.
- ``read_csv``: CSV with a header row. A file without quotes and with LF or CRLF line ends
  (every MovieLens ratings file) is parsed by pandas for speed, one record per line, and a
  row pandas padded is located by re-counting that raw line's commas; any other file (quoted
  fields, which may hold commas and line breaks, or CR-only line ends) is parsed record by
  record with the ``csv`` module (strict quoting, no field size limit). Both give the same
  values; every record has exactly the header's field count, and a row is reported by the
  line its record starts on. Duplicate column names are refused.
- ``read_parquet``: typed tables; positions are reported as ``row N`` (1-based). Every column
  in the file is read, one pandas stored as the index included.

Line ends are LF, CRLF or CR (as pandas and the ``csv`` module read them), never other
Unicode line separators. Deliberately left out: what the columns mean and their value
checks (``offline.loaders.checks``).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from offline.schema import DataError

LINE = "_line"  # column holding each row's line (or row) number in its file

SEPARATOR_NAMES = {"\t": "tab", "|": "'|'", "::": "'::'", ",": "comma"}
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_LINE_BREAK_BYTES = re.compile(rb"\r\n|\r|\n")
_BARE_CR = re.compile(r"\r(?!\n)")
_MAX_FIELD = 2**31 - 1  # the csv module's field limit is a C long; no real field comes near


@dataclass(frozen=True)
class Table:
    """Rows of one file: one column per field (plus ``_line``), and how to point at a row."""

    file: str  # the file name used in messages, e.g. "u.data"
    rows: pd.DataFrame
    unit: str = "line"  # "line" for text files, "row" for Parquet

    def __len__(self) -> int:
        return len(self.rows)

    def has(self, column: str) -> bool:
        return column in self.rows.columns

    def where(self, pos: int) -> str:
        """``"u.data line 17"`` for the row at position ``pos``."""
        return f"{self.file} {self.unit} {int(self.rows[LINE].iat[pos])}"

    def fail_first(self, bad: np.ndarray | pd.Series, message: Callable[[int], str]) -> None:
        """Raise DataError at the first True of ``bad`` (a mask over rows); ``message(pos)`` explains."""
        hits = np.flatnonzero(np.asarray(bad, dtype=bool))
        if len(hits):
            pos = int(hits[0])
            raise DataError(f"{self.where(pos)}: {message(pos)}")


UTF8_ELSE_LATIN1 = "utf-8, else latin-1"  # a `decode` encoding: see there


def decode(path: Path, encoding: str) -> str:
    """The whole file as text; DataError naming the file (and the line of a bad byte).

    ``UTF8_ELSE_LATIN1`` reads a file as UTF-8 when its bytes are valid UTF-8, else as latin-1: the
    '::' layout is ML-1M's (latin-1) and MovieTweetings' (UTF-8); ASCII reads alike either way, and
    latin-1 text with accents is almost never valid UTF-8.
    """
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    raw = path.read_bytes()
    if encoding == UTF8_ELSE_LATIN1:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("latin-1")
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as exc:
        line = len(_LINE_BREAK_BYTES.findall(raw, 0, exc.start)) + 1
        raise DataError(f"{path.name} line {line}: not valid {encoding} ({exc.reason})") from exc


def _lines(text: str) -> list[str]:
    # Only \n, \r\n and \r end a line, not splitlines()'s set: latin-1 byte 0x85 decodes to
    # U+0085, which splitlines treats as a line break and would shift every later line number.
    if "\r" not in text:
        return text.split("\n")
    return _LINE_BREAK.split(text)


def read_delimited(path: Path, sep: str, columns: Sequence[str], encoding: str = "utf-8") -> Table:
    """A headerless file with exactly ``len(columns)`` ``sep``-separated fields per line.

    Blank lines are skipped (their numbers are still counted).
    """
    lines = _lines(decode(path, encoding))
    numbers = [i + 1 for i, ln in enumerate(lines) if ln.strip()]
    fields = [lines[n - 1].split(sep) for n in numbers]
    want = len(columns)
    for n, row in zip(numbers, fields, strict=True):
        if len(row) != want:
            sep_name = SEPARATOR_NAMES.get(sep, repr(sep))
            raise DataError(f"{path.name} line {n}: expected {want} {sep_name}-separated fields, got {len(row)}")
    rows = pd.DataFrame(fields, columns=list(columns), dtype=object) if fields else pd.DataFrame(
        {c: pd.Series([], dtype=object) for c in columns}
    )
    rows[LINE] = np.asarray(numbers, dtype=np.int64)
    return Table(path.name, rows)


def first_row_width(path: Path, sep: str, encoding: str = "utf-8") -> int:
    """How many ``sep``-separated fields the first non-blank line of a headerless file has (0: none).

    Lets a loader tell one layout of a file from another before ``read_delimited`` holds every line
    to that count.
    """
    return next((len(ln.split(sep)) for ln in _lines(decode(path, encoding)) if ln.strip()), 0)


_PANDAS_FIELDS = re.compile(r"Expected (\d+) fields in line (\d+), saw (\d+)")


def read_csv(
    path: Path, required: Sequence[str], encoding: str = "utf-8", rename: Mapping[str, str] | None = None
) -> Table:
    """A CSV file with a header row holding at least the ``required`` columns (values as str).

    Blank lines, and rows whose fields are all empty, are skipped (their lines still count).
    ``rename`` maps a header name to the column name it is read as (``required`` names the
    header's); a header that already holds the new name is refused, as a duplicate name is.
    """
    text = decode(path, encoding).removeprefix("\ufeff")  # a byte-order mark is not part of the header
    plain = '"' not in text and _BARE_CR.search(text) is None
    header_line, header, rows, numbers = (_parse_plain if plain else _parse_quoted)(path.name, text, required)
    columns = _column_names(path.name, header_line, header, required, rename or {})
    rows.columns = pd.Index(columns)
    rows[LINE] = numbers
    return Table(path.name, rows)


def _empty_file(file: str, required: Sequence[str]) -> DataError:
    return DataError(f"{file}: empty file (expected a header row with {list(required)})")


def _field_count(file: str, line: int, want: int, got: int) -> DataError:
    return DataError(f"{file} line {line}: expected {want} comma-separated fields, got {got}")


def _parse_plain(
    file: str, text: str, required: Sequence[str]
) -> tuple[int, list[str], pd.DataFrame, np.ndarray]:
    """pandas on a file with no quote and no bare CR: each line is one record."""
    start, skipped = 0, 0  # leading blank lines (pandas would take the first as the header)
    while True:
        end = text.find("\n", start)
        first = text[start: len(text) if end < 0 else end].removesuffix("\r")
        if first:
            break
        if end < 0:
            raise _empty_file(file, required)
        start, skipped = end + 1, skipped + 1
    header = first.split(",")
    try:
        # header=None: the header line itself sets the field count, so a longer row is an
        # error (with a header, pandas would silently take a longer first row's extra field
        # as an index); a shorter row is padded with "" and checked below.
        frame = pd.read_csv(io.StringIO(text[start:] if start else text), header=None, dtype=str,
                            keep_default_na=False, skip_blank_lines=False)
    except pd.errors.ParserError as exc:
        m = _PANDAS_FIELDS.search(str(exc))
        if m:
            raise _field_count(file, int(m.group(2)) + skipped, int(m.group(1)), int(m.group(3))) from exc
        raise DataError(f"{file}: not valid CSV ({exc})") from exc
    if frame.shape[1] != len(header):  # cannot happen without quotes; never trust a guess
        raise DataError(f"{file} line {skipped + 1}: header has {len(header)} fields, pandas read {frame.shape[1]}")
    rows = frame.iloc[1:].reset_index(drop=True)
    rows.columns = pd.RangeIndex(len(header))
    numbers = np.arange(skipped + 2, skipped + 2 + len(rows), dtype=np.int64)
    blank = (rows == "").all(axis=1).to_numpy()
    rows, numbers = rows.loc[~blank].reset_index(drop=True), numbers[~blank]
    # pandas pads a short row with "" instead of failing; only rows whose last field is empty
    # can be short, so only those raw lines are re-counted (no quotes: fields = commas + 1).
    padded = np.flatnonzero((rows[len(header) - 1] == "").to_numpy())
    if len(padded):
        lines = _lines(text)
        for pos in padded:
            got = lines[numbers[pos] - 1].count(",") + 1
            if got != len(header):
                raise _field_count(file, int(numbers[pos]), len(header), got)
    return skipped + 1, header, rows, numbers


def _parse_quoted(
    file: str, text: str, required: Sequence[str]
) -> tuple[int, list[str], pd.DataFrame, np.ndarray]:
    """The ``csv`` module, record by record: quoted commas and line breaks, CR line ends."""
    old_limit = csv.field_size_limit()
    csv.field_size_limit(max(old_limit, min(len(text) + 1, _MAX_FIELD)))  # pandas has no limit either
    try:
        reader = csv.reader(io.StringIO(text, newline=""), strict=True)
        header: list[str] | None = None
        header_line, line = 0, 1  # line: where the record being read starts
        records: list[list[str]] = []
        numbers: list[int] = []
        try:
            for fields in reader:
                if header is None:
                    if fields:  # [] is an empty line
                        header, header_line = fields, line
                elif len(fields) > len(header) or (len(fields) < len(header) and any(fields)):
                    raise _field_count(file, line, len(header), len(fields))
                elif any(fields):
                    records.append(fields)
                    numbers.append(line)
                line = reader.line_num + 1
        except csv.Error as exc:
            why = "a quoted field is never closed" if "unexpected end of data" in str(exc) else str(exc)
            raise DataError(f"{file} line {line}: not valid CSV ({why})") from exc
    finally:
        csv.field_size_limit(old_limit)
    if header is None:
        raise _empty_file(file, required)
    rows = pd.DataFrame(records, columns=pd.RangeIndex(len(header)), dtype=str)
    return header_line, header, rows, np.asarray(numbers, dtype=np.int64)


def _column_names(
    file: str, header_line: int, header: list[str], required: Sequence[str], rename: Mapping[str, str]
) -> list[str]:
    """Header fields as column names (an empty one becomes "Unnamed: i", as pandas names it),
    renamed by ``rename``."""
    names = [name or f"Unnamed: {i}" for i, name in enumerate(header)]
    where = f"{file} line {header_line}"
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise DataError(f"{where}: duplicate column name(s) {duplicated}; each column must be named once")
    if LINE in names:
        raise DataError(f"{where}: column name {LINE!r} is reserved; rename that column")
    missing = [c for c in required if c not in names]
    if missing:
        raise DataError(f"{where}: header lacks column(s) {missing}; found {names}")
    for old, new in rename.items():
        if old in names and new in names:
            raise DataError(f"{where}: column {new!r} clashes with {old!r} (renamed to {new}); drop or rename one")
    return [rename.get(n, n) for n in names]


def read_parquet(path: Path, required: Sequence[str]) -> Table:
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:  # pyarrow raises several unrelated types for a corrupt file
        names = pq.read_schema(path).names
    except Exception as exc:
        raise DataError(f"{path.name}: not a readable Parquet file ({exc})") from exc
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:  # pyarrow could not read them by name either
        raise DataError(f"{path.name}: duplicate column name(s) {duplicated}; each column must be named once")
    try:
        rows = pd.read_parquet(path)
    except Exception as exc:
        raise DataError(f"{path.name}: not a readable Parquet file ({exc})") from exc
    rows = _index_as_columns(rows)
    if LINE in rows.columns:
        raise DataError(f"{path.name}: column name {LINE!r} is reserved; rename that column")
    missing = [c for c in required if c not in rows.columns]
    if missing:
        raise DataError(f"{path.name}: missing column(s) {missing}; found {list(rows.columns)}")
    rows[LINE] = np.arange(1, len(rows) + 1, dtype=np.int64)
    return Table(path.name, rows, unit="row")


def _index_as_columns(rows: pd.DataFrame) -> pd.DataFrame:
    """The pandas index pandas stored in the file, as the columns it is in the file's schema.

    ``items.set_index("item_id").to_parquet(...)`` stores ``item_id`` as a column, which pandas
    reads back as the index: it becomes a column again, after the others (its place in the
    file). An unnamed index (a default RangeIndex, or ``__index_level_0__`` when filtered) is
    row numbering, not data, and is dropped, as is an index named like a column
    (``set_index("item_id", drop=False)``), which the file holds as ``__index_level_0__``.
    """
    named = [name for name in rows.index.names if name is not None and name not in rows.columns]
    if named:
        rows = rows.reset_index(level=named)
        rows = rows[[*rows.columns[len(named):], *rows.columns[:len(named)]]]
    return rows.reset_index(drop=True)


def find_table_file(directory: Path, stem: str) -> Path | None:
    """``stem.csv`` or ``stem.parquet`` in ``directory`` (DataError if both exist), else None."""
    found = [directory / f"{stem}{ext}" for ext in (".csv", ".parquet") if (directory / f"{stem}{ext}").is_file()]
    if len(found) > 1:
        raise DataError(f"{directory}: both {found[0].name} and {found[1].name} exist; keep one")
    return found[0] if found else None


def read_table(path: Path, required: Sequence[str]) -> Table:
    """CSV or Parquet by extension."""
    if path.suffix == ".parquet":
        return read_parquet(path, required)
    return read_csv(path, required)
