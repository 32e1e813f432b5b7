"""The file layout of a trained recall directory: the names training writes and serving reads.

``recall.train`` writes the two-tower files, ``recall.extra_channels`` the channel files, and
``recall.model`` reads both back. The names live here, below all three, so that loading a model
imports no training code (and no torch until the weights are read).

| name | what |
|---|---|
| ``model.pt`` | both towers' state dicts |
| ``model.json`` | config, vocabularies, item count (``refit_of`` for a refit model) |
| ``item_vectors.npy`` | the trained item vectors, row i == item_idx i |
| ``index/`` | the faiss index over them (``recall.index.ItemIndex``) |
| ``report.json`` | the training report |
| ``channels/<name>.npz``, ``channels.json`` | the extra channels' matrices, their shares |

Deliberately left out: writing and reading the files themselves.
"""

from __future__ import annotations

import json
from pathlib import Path

MODEL_FILE, SPEC_FILE, VECTORS_FILE, INDEX_DIR, REPORT_FILE = (
    "model.pt", "model.json", "item_vectors.npy", "index", "report.json")
CHANNELS_DIR, CHANNELS_FILE = "channels", "channels.json"


def is_trained(recall_dir: Path) -> bool:
    """Whether ``recall_dir`` holds a trained model (its ``model.json``, written last)."""
    return (Path(recall_dir) / SPEC_FILE).is_file()


def check_trained(recall_dir: Path) -> None:
    """``FileNotFoundError`` naming the missing ``model.json`` unless ``recall_dir`` holds a trained model."""
    if not is_trained(recall_dir):
        raise FileNotFoundError(f"{Path(recall_dir) / SPEC_FILE}: no trained recall model here (run training first)")


def refit_of(recall_dir: Path) -> str | None:
    """The early-stopped version a refit model in ``recall_dir`` was trained after (None: not a refit)."""
    spec = json.loads((Path(recall_dir) / SPEC_FILE).read_text())
    return spec.get("refit_of") if isinstance(spec, dict) else None
