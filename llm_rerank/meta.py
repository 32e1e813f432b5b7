"""The adaptation report saved beside a merged model: written by ``llm_rerank.adapt``, read by the stage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TRAIN_META = "train_meta.json"  # the adaptation report, saved beside the merged model


def read_train_meta(directory: Path | str) -> dict[str, Any] | None:
    """The adaptation report saved with a merged model (``TRAIN_META``); None for any other model."""
    path = Path(directory) / TRAIN_META
    return json.loads(path.read_text()) if path.is_file() else None
