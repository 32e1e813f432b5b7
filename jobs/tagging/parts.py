"""The tagging job's files on disk: part files that carry their job version, and the manifest.

A part file is one chunk's tags as Parquet, written with page checksums and with the job version
(``jobs.tagging.job.job_version``) in its schema metadata under ``VERSION_KEY``, so what made a
part can be established from the part alone: a deleted or damaged ``manifest.json`` no longer
lets parts of another model, prompt or decoding count as done. Parts written before the version
moved into them carry none; they are trusted only under a manifest of the same version.

``read_manifest`` checks the manifest's shape (``{"version": {...}, "chunks": {stem: {"sha256":
str, ...}}}``) and treats one of another shape like a missing one, saying why. ``content_problem``
is the full check of a part the manifest does not vouch for (a kill between a part's rename and
the manifest write leaves a whole part with a sha256 the manifest has not recorded yet): it must
be this job's version, read whole with its checksums, and hold the first items of its chunk with
their ids.

Deliberately left out: chunking and the job's life cycle (``jobs.tagging.job``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

VERSION_KEY = b"recsys.tag_version"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def part_table(frame: pd.DataFrame, version: dict[str, Any]) -> pa.Table:
    """``frame`` as an Arrow table whose schema metadata carries ``version`` (sorted keys: the same
    version gives the same bytes)."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    stamp = json.dumps(version, sort_keys=True, separators=(",", ":")).encode()
    return table.replace_schema_metadata({**(table.schema.metadata or {}), VERSION_KEY: stamp})


def write_part_table(fh: IO[bytes], table: pa.Table) -> None:
    """Write a part (with page checksums, which ``content_problem`` verifies) to the open file ``fh``."""
    pq.write_table(table, fh, write_page_checksum=True)


def part_items(path: Path) -> int | None:
    """How many items the part file ``path`` holds (from its Parquet footer); None when absent or unreadable."""
    try:
        return pq.read_metadata(path).num_rows if path.exists() else None
    except (OSError, pa.ArrowException):
        return None


def unreadable(path: Path) -> str | None:
    """Why the Parquet footer of ``path`` cannot be read, or None when it can."""
    try:
        pq.read_metadata(path)
    except (OSError, pa.ArrowException) as exc:
        return f"cannot be read ({_one_line(exc)})"
    return None


def part_version(path: Path) -> dict[str, Any] | None:
    """The job version the part at ``path`` was written with; None when it carries none (written
    before parts recorded it, or rewritten by hand) or its footer cannot be read."""
    try:
        stamp = (pq.read_schema(path).metadata or {}).get(VERSION_KEY)
        version = json.loads(stamp) if stamp is not None else None
    except (OSError, pa.ArrowException, ValueError):
        return None
    return version if isinstance(version, dict) else None


def read_part(path: Path) -> pd.DataFrame:
    """The part file at ``path``; a ValueError naming it when it cannot be read."""
    try:
        return pd.read_parquet(path)
    except (OSError, pa.ArrowException) as exc:
        raise ValueError(f"{path}: cannot be read ({_one_line(exc)}); rerun `recsys tag` to redo it") from exc


def read_manifest(path: Path) -> tuple[dict[str, Any] | None, str]:
    """(the manifest at ``path``, '') when it is one; (None, why not) when it is missing or of another shape.

    >>> read_manifest(Path("/nonexistent/manifest.json"))
    (None, '/nonexistent/manifest.json is missing')
    """
    if not path.exists():
        return None, f"{path} is missing"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return None, f"{path} is not a tagging manifest ({_one_line(exc)})"
    why = _manifest_shape_problem(manifest)
    return (manifest, "") if why is None else (None, f"{path} is not a tagging manifest ({why})")


def _manifest_shape_problem(manifest: object) -> str | None:
    """What keeps ``manifest`` from being ``{"version": {...}, "chunks": {stem: {"sha256": str}}}``, or None."""
    if not isinstance(manifest, dict):
        return f"a JSON {type(manifest).__name__}, not an object"
    if not isinstance(manifest.get("version"), dict):
        return "no 'version' object"
    chunks = manifest.get("chunks")
    if not isinstance(chunks, dict):
        return "no 'chunks' object"
    for stem, record in chunks.items():
        if not isinstance(record, dict) or not isinstance(record.get("sha256"), str):
            return f"chunks[{stem!r}] is not an object with a 'sha256' string"
    return None


def content_problem(path: Path, version: dict[str, Any], first: int, ids: Sequence[str]) -> str | None:
    """Why the part at ``path`` is not a whole part of ``version`` holding items ``first, first+1, ...``
    (at least one, at most ``len(ids)``) with the ids ``ids``; None when it is. Reads the whole file."""
    made_with = part_version(path)
    if made_with is None:
        return "it carries no job version of its own"
    if made_with != version:
        return "it was written by another job version"
    try:
        table = pq.read_table(path, page_checksum_verification=True)
    except (OSError, pa.ArrowException) as exc:
        return f"it cannot be read whole ({_one_line(exc)})"
    if "item_idx" not in table.column_names or "item_id" not in table.column_names:
        return "it has no item_idx and item_id columns"
    got, got_ids = table.column("item_idx").to_pylist(), table.column("item_id").to_pylist()
    if not 1 <= len(got) <= len(ids) or got != list(range(first, first + len(got))):
        return f"it does not hold items {first}.. of its chunk in order"
    if [str(i) for i in got_ids] != list(ids[: len(got)]):
        return "its item ids are not the catalog's"
    return None
