"""Artifact manifests: the SHA-256 of every file a trained stage wrote, checked before it is parsed.

Training ends each stage by writing ``manifest.json`` (``write_manifest``: every file under the
stage's directory, by relative path, with its digest), then the ``stage.json`` completion marker
(``jobs.train``). Every stage's ``load`` calls ``verify_directory`` on the directory it reads
before any native library (LightGBM, torch, numpy's zip reader, faiss) sees a byte of it, so a
truncated or corrupt file is refused as ``ArtifactIntegrityError`` naming the file, never parsed
into an abort or a segfault. ``check_file`` is the one digest comparison: the faiss index's own
record in ``index.json`` (``recall.index``) goes through it too.

Artifacts trained before manifests existed (a ``stage.json`` but no ``manifest.json``) load with
one warning per directory and process saying they are unverified; the next ``recsys train``
records the manifest of each stage it reuses (``jobs.train``). A directory with neither file is
one being trained (the recall stage tunes its channels on a model it has just written) or not
written by training at all; it is not checked and nothing is said.

Not listed: dot-files (temporary siblings of atomic writes), the marker and the manifest
themselves, ``CACHE_DIRS`` (rebuilt by training when absent, never read by a served stage) and
sub-directories that hold their own ``stage.json`` (another stage's). Deliberately left out:
signatures (a digest guards against damage, not against someone who can rewrite the manifest).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

from recsys.atomic import atomic_write_json
from recsys.digest import file_sha256

log = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
MARKER_FILE = "stage.json"
CACHE_DIRS = frozenset({"text_cache"})  # recall.train's MiniLM cache: content-keyed, rebuilt when missing
_WARNED: set[Path] = set()  # unverified directories already reported by this process


class ArtifactIntegrityError(ValueError):
    """A file a stage would load is missing or differs from the digest recorded at training."""

    def __init__(self, path: Path, reason: str):
        self.path = Path(path)
        super().__init__(f"{path}: {reason}")


def _listed(directory: Path) -> Iterator[Path]:
    """The files a manifest of ``directory`` lists (see the module docstring), sorted."""
    for path in sorted(directory.iterdir()):
        if path.name.startswith(".") or path.name in (MANIFEST_FILE, MARKER_FILE):
            continue
        if path.is_dir():
            if path.name not in CACHE_DIRS and not (path / MARKER_FILE).exists():
                yield from _listed(path)
        elif path.is_file():
            yield path


def write_manifest(directory: Path | str) -> Path:
    """Record the digest of every file under ``directory`` in ``directory/manifest.json`` (atomic)."""
    directory = Path(directory)
    files = {path.relative_to(directory).as_posix(): file_sha256(path) for path in _listed(directory)}
    return atomic_write_json(directory / MANIFEST_FILE, {"algorithm": "sha256", "files": files})


def check_file(path: Path, expected: object, recorded_in: Path) -> None:
    """``ArtifactIntegrityError`` unless ``path`` is a file whose SHA-256 is ``expected``."""
    if not path.is_file():
        raise ArtifactIntegrityError(path, f"missing: {recorded_in} lists it; restore it or retrain "
                                           "(`recsys train --force`)")
    if not isinstance(expected, str) or file_sha256(path) != expected:
        raise ArtifactIntegrityError(path, f"damaged: its SHA-256 differs from the one {recorded_in} recorded at "
                                           "training; restore it or retrain (`recsys train --force`)")


def recorded_files(directory: Path) -> dict[str, str] | None:
    """``{relative path: sha256}`` of ``directory``'s manifest; None when it has none.

    A manifest that is not such a record is itself damaged (``ArtifactIntegrityError``).
    """
    path = Path(directory) / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        files = record["files"]
        if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
            raise TypeError("files is not an object of digests")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ArtifactIntegrityError(path, f"unreadable manifest ({type(exc).__name__}: {exc}); retrain "
                                           "(`recsys train --force`)") from None
    return {str(k): v for k, v in files.items()}


def _marker_records_manifests(directory: Path) -> bool:
    """Whether ``directory``'s ``stage.json`` was written by a training run that records manifests (it
    then also records ``serving_config_id``): such a stage without its manifest has lost it."""
    try:
        marker = json.loads((directory / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and "serving_config_id" in marker


def verify_directory(directory: Path | str, loads: tuple[str, ...] = ()) -> bool:
    """Check every file ``directory``'s manifest lists; True when verified, False when there is none.

    Raises ``ArtifactIntegrityError`` naming the first missing or damaged file, a manifest that lists
    none of ``loads`` (the files the caller parses: a manifest that does not cover them verifies
    nothing), or a missing manifest where ``stage.json`` says training recorded one. Without a
    manifest and with a ``stage.json`` from before manifests existed, warns once that it is unverified.
    """
    directory = Path(directory)
    files = recorded_files(directory)
    if files is None and _marker_records_manifests(directory):
        raise ArtifactIntegrityError(directory / MANIFEST_FILE, "missing: training recorded the digests of this "
                                     "stage's files there, so they cannot be verified; restore it or retrain "
                                     "(`recsys train --force`)")
    if files is not None and (unlisted := [f for f in loads if f not in files]):
        raise ArtifactIntegrityError(directory / MANIFEST_FILE, f"does not list {', '.join(unlisted)}, which this "
                                     "stage loads; restore it or retrain (`recsys train --force`)")
    if files is None:
        if (directory / MARKER_FILE).is_file() and directory.resolve() not in _WARNED:
            _WARNED.add(directory.resolve())
            log.warning("%s: trained before artifact digests were recorded, so its files load unverified; "
                        "`recsys train` records them", directory)
        return False
    manifest = directory / MANIFEST_FILE
    for relative, digest in files.items():
        path = directory / relative
        if Path(relative).is_absolute() or ".." in Path(relative).parts:
            raise ArtifactIntegrityError(manifest, f"lists {relative!r}, outside {directory}")
        check_file(path, digest, manifest)
    return True


def damaged_file(exc: BaseException | None) -> Path | None:
    """The file an ``ArtifactIntegrityError`` in ``exc``'s chain of causes names; None when there is none."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, ArtifactIntegrityError):
            return exc.path
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None
