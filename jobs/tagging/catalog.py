"""Which catalog a tagging job's outputs belong to, and the check every reader here makes.

Tags are stored by position (row i = item_idx i, ``hidden.npy`` likewise), and a split prepared
again may order or choose its items differently. So the job version carries ``catalog_digest``
of the split's item ids in order (``jobs.tagging.job.job_version``: parts made for another
catalog are refused, never resumed), and whatever reads ``tags.parquet`` against a split
(``wiring.merge_tags``, ``embed.train_embeddings``, ``job.finalize``, and the coarse ranker's
``jobs.coarse_tags.load_item_tags``) calls ``require_same_items`` first: one item's tags never
land on another.

The LLM-embedding recall channel (``recall.llm_channel``) reads ``embed/embeddings.npy`` by
position too: it compares the catalog digest embed-train recorded (``embed/meta.json``,
``tags_version.catalog``) with the split's when it loads. ``catalog_digest`` lives in the data
layer (``offline.tag_store``), so the job and the channel compute one digest.

Deliberately left out: which items changed (the readers name the first row that differs).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from offline.tag_store import catalog_digest

__all__ = ["catalog_digest", "require_same_items"]


def require_same_items(tag_ids: Sequence[object], items: pd.DataFrame, source: str) -> None:
    """Raise ValueError naming ``source`` unless ``tag_ids`` are ``items.item_id`` in the same order.

    >>> require_same_items(["a", "b"], pd.DataFrame({"item_id": ["a", "b"]}), "tags.parquet")
    >>> require_same_items(["b", "a"], pd.DataFrame({"item_id": ["a", "b"]}), "tags.parquet")
    Traceback (most recent call last):
    ...
    ValueError: tags.parquet: row 0 holds the tags of item 'b' but the split's item_idx 0 is 'a': the tags were made for another catalog (the split was prepared again); re-run `recsys tag --fresh`
    """
    tags = [str(i) for i in tag_ids]
    split = [str(i) for i in items["item_id"]]
    if len(tags) != len(split):
        raise ValueError(f"{source}: tags cover {len(tags)} items, the split has {len(split)}: "
                         "re-run `recsys tag` for the whole catalog")
    wrong = next((i for i, (a, b) in enumerate(zip(tags, split, strict=True)) if a != b), None)
    if wrong is not None:
        raise ValueError(f"{source}: row {wrong} holds the tags of item {tags[wrong]!r} but the split's item_idx "
                         f"{wrong} is {split[wrong]!r}: the tags were made for another catalog (the split was "
                         "prepared again); re-run `recsys tag --fresh`")
