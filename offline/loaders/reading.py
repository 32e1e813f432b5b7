"""Raw dataset files -> string tables that remember which line each row came from.

Every loader reads through here so that a malformed file is reported the same way:
``DataError("u.data line 17: expected 4 tab-separated fields, got 3")``. Bytes are decoded
up front (a bad byte is reported by line, not as a codec traceback), then split:

- ``read_delimited``: headerless, unquoted files (MovieLens ``u.*`` and ``*.dat``); the
  field count of every line is checked.
- ``read_csv``: CSV with a header row, parsed by pandas for speed; a row with a missing
  field is located afterwards by re-reading just that raw line.
- ``read_parquet``: typed tables; positions are reported as ``row N`` (1-based).

Deliberately left out: what the columns mean and their value checks (``offline.loaders.checks``).
Line numbers assume no quoted field spans several lines (true of every MovieLens release).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from offline.schema import DataError

LINE = "_line"  # column holding each row's line (or row) number in its file

SEPARATOR_NAMES = {"\t": "tab", "|": "'|'", "::": "'::'", ",": "comma"}


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


def decode(path: Path, encoding: str) -> str:
    """The whole file as text; DataError naming the file (and the line of a bad byte)."""
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    raw = path.read_bytes()
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(f"{path.name} line {line}: not valid {encoding} ({exc.reason})") from exc


def _lines(text: str) -> list[str]:
    # split("\n"), not splitlines(): latin-1 byte 0x85 decodes to U+0085, which splitlines
    # treats as a line break and would shift every later line number.
    lines = text.split("\n")
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


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


_PANDAS_FIELDS = re.compile(r"Expected (\d+) fields in line (\d+), saw (\d+)")


def read_csv(path: Path, required: Sequence[str], encoding: str = "utf-8") -> Table:
    """A CSV file with a header row holding at least the ``required`` columns (values as str)."""
    text = decode(path, encoding)
    try:
        rows = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, skip_blank_lines=False)
    except pd.errors.EmptyDataError as exc:
        raise DataError(f"{path.name}: empty file (expected a header row with {list(required)})") from exc
    except pd.errors.ParserError as exc:
        m = _PANDAS_FIELDS.search(str(exc))
        if m:
            raise DataError(
                f"{path.name} line {m.group(2)}: expected {m.group(1)} comma-separated fields, got {m.group(3)}"
            ) from exc
        raise DataError(f"{path.name}: not valid CSV ({exc})") from exc
    missing = [c for c in required if c not in rows.columns]
    if missing:
        raise DataError(f"{path.name} line 1: header lacks column(s) {missing}; found {list(rows.columns)}")
    rows[LINE] = np.arange(2, len(rows) + 2, dtype=np.int64)  # line 1 is the header
    data_cols = [c for c in rows.columns if c != LINE]
    blank = (rows[data_cols] == "").all(axis=1).to_numpy()
    rows = rows.loc[~blank].reset_index(drop=True)
    table = Table(path.name, rows)
    _check_short_rows(table, _lines(text), len(data_cols))
    return table


def _check_short_rows(table: Table, lines: list[str], want: int) -> None:
    # pandas pads a short row with "" instead of failing; only rows whose last field is empty
    # can be short, so only those raw lines are re-parsed.
    last = table.rows.columns[-2]  # the column before _line
    for pos in np.flatnonzero((table.rows[last] == "").to_numpy()):
        line_no = int(table.rows[LINE].iat[pos])
        got = len(next(csv.reader([lines[line_no - 1]]), []))
        if got != want:
            raise DataError(f"{table.file} line {line_no}: expected {want} comma-separated fields, got {got}")


def read_parquet(path: Path, required: Sequence[str]) -> Table:
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        rows = pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several unrelated types for a corrupt file
        raise DataError(f"{path.name}: not a readable Parquet file ({exc})") from exc
    missing = [c for c in required if c not in rows.columns]
    if missing:
        raise DataError(f"{path.name}: missing column(s) {missing}; found {list(rows.columns)}")
    rows = rows.reset_index(drop=True)
    rows[LINE] = np.arange(1, len(rows) + 1, dtype=np.int64)
    return Table(path.name, rows, unit="row")


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
