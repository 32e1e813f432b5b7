"""The tag-feature coarse model, ``<artifact_dir>/coarse_tags``, trained from existing artifacts.

Inputs: ``split/``, ``recall_holdout/`` (the candidates, exactly as for ``coarse/``) and ``tags/``
(the tagging job's ``tags.parquet`` and ``hidden.npy``). Output: a ``coarse_rank.train`` model
with ``CoarseConfig.tag_features`` on, served by ``CoarseStage`` with ``params: {subdir:
coarse_tags}``, plus ``tags_source.json`` (what it was trained from, so ``is_current`` can tell
a stale model). The fitted builder carries the tag tables, so serving never reads ``tags/``.

Leakage: the coarse ranker's train labels are each user's last ``train_positions`` training
items. ``tags/embed/embeddings.npy`` was trained (InfoNCE on consecutive items) on whole
training sequences, so it has seen every label's transition; a cosine feature from it would be
sharper on train labels than at serving and LightGBM would over-trust it. So a second
projection of the same cached hidden states is trained here on the sequences without those
items (``jobs.train.holdout_sequences``, as for ``recall_holdout``) and this one embedding is
used for training, validation and serving. It trains in seconds on the cached states.

Deliberately left out: the default coarse model (``jobs.train``) and evaluation
(``jobs.tagging.ablation``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from cascade.settings import Settings
from coarse_rank.config import TRAINING_REVISION, CoarseConfig
from coarse_rank.item_tags import ItemTags
from coarse_rank.train import train_coarse
from jobs.tagging.catalog import require_same_items
from jobs.tagging.embed import EmbedSettings, project_hidden
from jobs.tagging.job import require_tag_columns
from jobs.train import holdout_recall, holdout_sequences
from offline.split import Split, split_id
from offline.tag_store import load_tags
from recall.artifacts import MODEL_FILE
from recsys.atomic import atomic_write_json
from recsys.digest import file_sha256
from recsys.manifest import write_manifest

SUBDIR = "coarse_tags"
SOURCE_FILE = "tags_source.json"


def holdout_embeddings(split: Split, hidden: np.ndarray, positions: int,
                       settings: EmbedSettings) -> tuple[np.ndarray, dict]:
    """Unit ``[n_items, dim]`` embeddings projected from ``hidden`` by an MLP trained without the labels.

    The InfoNCE pairs come from the training sequences cut by their last ``positions`` items;
    """
    if len(hidden) != split.n_items:
        raise ValueError(f"{len(hidden)} pooled hidden states for a catalog of {split.n_items} items")
    vectors, report = project_hidden(hidden, holdout_sequences(split, positions)[0], settings)
    return vectors, {**report, "holdout_positions": positions}


def load_item_tags(split: Split, tags_dir: Path, positions: int, settings: EmbedSettings) -> tuple[ItemTags, dict]:
    """``ItemTags`` from ``tags_dir`` with the leak-free embeddings of ``holdout_embeddings``."""
    frame, hidden, _ = load_tags(tags_dir)
    require_tag_columns(frame, Path(tags_dir) / "tags.parquet")
    checked = ItemTags.from_tags(frame, hidden, split.n_items)  # coverage errors before any training
    require_same_items(frame["item_id"], split.items, str(Path(tags_dir) / "tags.parquet"))  # and the same items
    vectors, report = holdout_embeddings(split, hidden, positions, settings)
    return dataclasses.replace(checked, embeddings=vectors), report


def tags_source(settings: Settings, artifact_dir: Path, embed: EmbedSettings) -> dict[str, Any]:
    """What a coarse_tags model depends on: input digests and settings (compared by ``is_current``)."""
    root = Path(artifact_dir)
    inputs = [root / "tags" / "tags.parquet", root / "tags" / "hidden.npy", root / "recall_holdout" / MODEL_FILE]
    for path in inputs:
        if not path.exists():
            raise FileNotFoundError(f"{path} missing: coarse_tags needs `recsys tag` and a trained recall_holdout")
    return {"digests": {str(p.relative_to(root)): file_sha256(p)[:16] for p in inputs},
            "coarse": _tag_config(settings).model_dump(), "embed": dataclasses.asdict(embed), "seed": settings.seed,
            "training_revision": TRAINING_REVISION}


def is_current(settings: Settings, artifact_dir: Path, embed: EmbedSettings) -> bool:
    """True when ``coarse_tags/`` is complete and was trained from the present inputs and settings."""
    recorded = _recorded_source(artifact_dir)
    return recorded is not None and recorded == tags_source(settings, artifact_dir, embed)


def _recorded_source(artifact_dir: Path) -> dict[str, Any] | None:
    """The ``tags_source`` a complete ``coarse_tags/`` was trained from; None when there is none."""
    out = Path(artifact_dir) / SUBDIR
    if not (out / "meta.json").exists() or not (out / SOURCE_FILE).exists():
        return None
    return json.loads((out / SOURCE_FILE).read_text())["source"]


def train_coarse_tags(settings: Settings, artifact_dir: Path, split: Split, *, embed: EmbedSettings | None = None,
                      progress: bool = True, source: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train ``<artifact_dir>/coarse_tags`` (``settings.coarse`` with ``tag_features`` on); its report.

    ``source``: the ``tags_source`` of these inputs when the caller already has it.
    """
    root = Path(artifact_dir)
    embed = embed or EmbedSettings(seed=settings.seed)
    source = source or tags_source(settings, root, embed)
    config = _tag_config(settings)
    tags, embed_report = load_item_tags(split, root / "tags", config.train_positions, embed)
    recall, before_labels = holdout_recall(settings, root, split, config.train_positions)
    report = train_coarse(split, recall, root / SUBDIR, config, seed=settings.seed, progress=progress, tags=tags,
                          train_stage=before_labels)
    atomic_write_json(root / SUBDIR / SOURCE_FILE, {"source": source, "embedding": embed_report})
    write_manifest(root / SUBDIR)  # the digests its load checks (recsys.manifest), before the marker
    # the split it indexes, as every trained stage records it (cascade.registry.check_trained_on_split)
    atomic_write_json(root / SUBDIR / "stage.json", {"split_id": split_id(root), "trained_by": "jobs.coarse_tags"})
    return {**report, "embedding": {k: v for k, v in embed_report.items() if k != "loss_per_epoch"}}


def ensure_coarse_tags(settings: Settings, artifact_dir: Path, split: Split, *, retrain: bool = False,
                       embed: EmbedSettings | None = None, progress: bool = True) -> dict[str, Any]:
    """Train ``coarse_tags/`` when missing, stale or ``retrain``; {"trained": bool, "report": ...}."""
    embed = embed or EmbedSettings(seed=settings.seed)
    recorded = None if retrain else _recorded_source(artifact_dir)
    source = tags_source(settings, artifact_dir, embed)  # input digests, computed once
    if recorded is not None and recorded == source:
        meta = json.loads((Path(artifact_dir) / SUBDIR / "meta.json").read_text())
        return {"trained": False, "report": meta["report"]}
    return {"trained": True, "report": train_coarse_tags(settings, artifact_dir, split, embed=embed,
                                                          progress=progress, source=source)}


def _tag_config(settings: Settings) -> CoarseConfig:
    return settings.coarse.model_copy(update={"tag_features": True})
