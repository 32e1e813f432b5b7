"""A fitted ``FeatureBuilder`` on disk: ``features.npz`` (arrays) and ``features.json`` (names,
vocabularies, config), written by ``coarse_rank.train`` and read by ``coarse_rank.stage``.

Loading checks that the saved feature names are the ones this code builds, so a model is never
served with columns in another order.

Deliberately left out: the model file (``coarse_rank.train``), digests (``recsys.manifest``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from coarse_rank.channel_features import PREFIX as CHANNEL_PREFIX
from coarse_rank.channel_features import ChannelTables
from coarse_rank.config import CoarseConfig
from coarse_rank.feature_tables import FeatureTables, Vocabularies
from coarse_rank.features import FeatureBuilder, check_tags
from coarse_rank.item_age import PREFIX as AGE_PREFIX
from coarse_rank.item_age import ItemAge
from coarse_rank.item_tags import PREFIX as TAG_PREFIX
from coarse_rank.item_tags import ItemTags
from coarse_rank.llm_features import PREFIX as LLM_PREFIX
from coarse_rank.llm_features import ItemEmbeddings, check_embeddings

ARRAYS_FILE, META_FILE = "features.npz", "features.json"
_FOLLOW = ("follow_data", "follow_indices", "follow_indptr")


def save_builder(builder: FeatureBuilder, directory: Path) -> None:
    """Write ``features.npz`` and ``features.json`` of a fitted ``builder`` into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, Any] = builder.tables.arrays()
    follow = {k: arrays.pop(k) for k in _FOLLOW}
    arrays.update(builder.tags.arrays() if builder.tags is not None else {})
    arrays.update(builder.channels.arrays() if builder.channels is not None else {})
    arrays.update(builder.llm.arrays() if builder.llm is not None else {})
    arrays.update(builder.age.arrays() if builder.age is not None else {})
    np.savez(directory / ARRAYS_FILE, **arrays, **follow)
    vocab = builder.vocab
    meta = {"config": builder.config.model_dump(), "feature_names": builder.feature_names,
            "score_columns": list(builder.score_columns), "flag_columns": list(builder.flag_columns),
            "categories": vocab.categories, "genders": vocab.genders, "occupations": vocab.occupations,
            **({"tags": builder.tags.vocabularies()} if builder.tags is not None else {})}
    (directory / META_FILE).write_text(json.dumps(meta, indent=2))


def load_builder(directory: Path) -> FeatureBuilder:
    """The builder ``save_builder`` wrote into ``directory``; ``FileNotFoundError`` when a file is
    missing, ``ValueError`` when its feature names are not this code's."""
    directory = Path(directory)
    for name in (META_FILE, ARRAYS_FILE):
        if not (directory / name).exists():
            raise FileNotFoundError(f"{directory / name}: no fitted feature builder here")
    meta = json.loads((directory / META_FILE).read_text())
    config = CoarseConfig(**{"item_age_features": False, **meta["config"]})  # a builder saved before them has none
    with np.load(directory / ARRAYS_FILE, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    n = len(arrays["log_pop"])
    tag_arrays = {k: arrays.pop(k) for k in [k for k in arrays if k.startswith(TAG_PREFIX)]}
    channel_arrays = {k: arrays.pop(k) for k in [k for k in arrays if k.startswith(CHANNEL_PREFIX)]}
    llm_arrays = {k: arrays.pop(k) for k in [k for k in arrays if k.startswith(LLM_PREFIX)]}
    age_arrays = {k: arrays.pop(k) for k in [k for k in arrays if k.startswith(AGE_PREFIX)]}
    builder = FeatureBuilder(
        config,
        columns=(tuple(meta["score_columns"]), tuple(meta["flag_columns"])),
        vocab=Vocabularies(meta["categories"], meta["genders"], meta["occupations"]),
        tables=FeatureTables.from_arrays(arrays),
        tags=(check_tags(config, ItemTags.from_arrays(tag_arrays, meta.get("tags", {})), n)
              if config.tag_features else None),
        channels=ChannelTables.from_arrays(channel_arrays, n, config) if config.channel_features else None,
        llm=(check_embeddings(config, ItemEmbeddings.from_arrays(llm_arrays, n), n)
             if config.llm_embedding_features is True else None),
        age=ItemAge.from_arrays(age_arrays, n) if config.item_age_features else None,
    )
    if builder.feature_names != meta["feature_names"]:
        raise ValueError(f"{directory / META_FILE}: feature names differ from this code's FEATURES")
    return builder
