"""Content digests of files, the one place artifacts and inputs are fingerprinted.

``json_sha256`` digests JSON-able values (configs) with keys sorted, so mapping order never
changes it. Used for faiss index integrity (``recall.index``), the split's source fingerprint
(``jobs.train``), tagging chunk manifests (``jobs.tagging.job``) and the inputs of the
tag-feature coarse model (``jobs.coarse_tags``). Callers shorten the hex digest as they need.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def file_sha256(path: Path | str) -> str:
    """Hex SHA-256 of a file's bytes, read in 4 MiB blocks (large files never sit in memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def json_sha256(value: Any) -> str:
    """Hex SHA-256 of ``value`` as JSON with sorted keys (``str`` for anything JSON cannot hold).

    >>> json_sha256({"b": 1, "a": [2]}) == json_sha256({"a": [2], "b": 1})
    True
    """
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()
