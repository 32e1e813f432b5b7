"""Reading what the tagging job (``jobs.tagging``) wrote: the data-level hand-off to the stages.

Stages below the jobs read tags through here, never through the job package: the coarse
ranker's tag features and ``jobs.coarse_tags`` (``load_tags``), the LLM-embedding recall
channel (``load_embeddings``) and the tag-driven rules (``load_tagged_items``).

Layout of ``<artifact_dir>/tags/``: ``tags.parquet`` + ``hidden.npy`` + ``version.json``
(``jobs.tagging.job.finalize``), ``embed/embeddings.npy`` (``jobs.tagging.embed``),
``items.parquet`` (``jobs.tagging.wiring.write_tagged_items``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from recsys.digest import json_sha256

TAGGED_ITEMS = "items.parquet"


def catalog_digest(item_ids: Iterable[object]) -> str:
    """16 hex digits of the item ids in order (order matters: it is what positions mean); the
    tagging job's version records it (``jobs.tagging.job.job_version``) and every reader of the
    tags or their embeddings checks it against the split's items.

    >>> catalog_digest(["a", "b"]) == catalog_digest(["a", "b"]), catalog_digest(["a", "b"]) == catalog_digest(["b", "a"])
    (True, False)
    """
    return json_sha256([str(i) for i in item_ids])[:16]


def load_tags(tags_dir: Path) -> tuple[pd.DataFrame, np.ndarray, dict[str, Any]]:
    """(tags table, pooled hidden states [n, d], version) written by ``jobs.tagging.job.finalize``."""
    tags_dir = Path(tags_dir)
    if not (tags_dir / "tags.parquet").exists():
        raise FileNotFoundError(f"{tags_dir}/tags.parquet missing: run `recsys tag` first")
    version = json.loads((tags_dir / "version.json").read_text())
    return pd.read_parquet(tags_dir / "tags.parquet"), np.load(tags_dir / "hidden.npy"), version


def load_embeddings(tags_dir: Path) -> np.ndarray:
    """The (n, dim) unit item embeddings written by ``jobs.tagging.embed.train_embeddings``."""
    path = Path(tags_dir) / "embed" / "embeddings.npy"
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: run `recsys tag embed-train` first")
    return np.load(path)


def load_tagged_items(artifact_dir: Path) -> pd.DataFrame:
    """The catalog merged with its tags (``<artifact_dir>/tags/items.parquet``)."""
    path = Path(artifact_dir) / "tags" / TAGGED_ITEMS
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: run `recsys tag` then `recsys tag merge-items`")
    return pd.read_parquet(path)
