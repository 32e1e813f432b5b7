"""Tags into the pipeline: a tagged copy of the split's items table for rules and features.

``merge_tags`` writes each item's tags into the ``attributes`` JSON key ``"tags"`` (the key
``rules.items.ItemAttributes`` reads: genres, themes and risk flags, prefixed ``genre:``,
``theme:`` and ``risk:``) and the summary into ``"llm_summary"``, and fills ``audience`` from
the tag *only where the catalog has none* (the catalog's own value is authoritative). Fallback
records add nothing (their tags are unknown, not empty claims). The tags must be the items'
own, by id and position (``jobs.tagging.catalog.require_same_items``): tags made for a split
prepared before this one are refused, never merged by position.

``write_tagged_items`` saves the result as ``<artifact_dir>/tags/items.parquet``; the
``rules_tagged`` stage kind (``rules.tagged.TaggedRulesStage``) loads it in place of the
split's items, so rule sets can gate on ``tags`` such as ``risk:violence``.

Deliberately left out: changing the split itself (it stays the untouched ground truth).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from jobs.tagging.catalog import require_same_items
from jobs.tagging.job import require_tag_columns
from offline.tag_store import TAGGED_ITEMS, load_tags
from recsys.atomic import atomic_write


def item_tag_list(row: Any) -> list[str]:
    """Flat tag strings of one tags-table row (empty for a fallback).

    >>> item_tag_list({"fallback": False, "genres": ["Drama"], "themes": ["sad"], "risk_flags": ["violence"]})
    ['genre:Drama', 'theme:sad', 'risk:violence']
    """
    if row["fallback"]:
        return []
    return ([f"genre:{g}" for g in row["genres"]] + [f"theme:{t}" for t in row["themes"]]
            + [f"risk:{r}" for r in row["risk_flags"]])


def merge_tags(items: pd.DataFrame, tags: pd.DataFrame, source: str = "the tags table") -> pd.DataFrame:
    """A copy of ``items`` (row i = item_idx i) with tags merged in (see module doc); ``source``
    names the tags in errors."""
    if len(tags) != len(items) or tags["item_idx"].tolist() != list(range(len(items))):
        raise ValueError(f"{source}: tags cover {len(tags)} items, the items table has {len(items)}: "
                         "re-run `recsys tag` for the whole catalog")
    require_same_items(tags["item_id"].tolist(), items, source)
    out = items.copy()
    attrs, audience = [], []
    for (_, item), (_, tag) in zip(items.iterrows(), tags.iterrows(), strict=True):
        try:
            parsed = json.loads(item["attributes"]) if item["attributes"] else {}
        except json.JSONDecodeError:
            parsed = {}
        if not isinstance(parsed, dict):
            parsed = {}
        parsed["tags"] = item_tag_list(tag)
        if not tag["fallback"]:
            parsed["llm_summary"] = tag["summary"]
        attrs.append(json.dumps(parsed, sort_keys=True))
        known = isinstance(item["audience"], str)
        audience.append(item["audience"] if known or tag["fallback"] else tag["audience"])
    out["attributes"] = attrs
    out["audience"] = pd.Series(audience, dtype=object)
    return out


def write_tagged_items(split: Any, tags_dir: Path) -> dict[str, Any]:
    """Write ``tags/items.parquet`` from the split's items and ``tags/tags.parquet``; a report."""
    tags, _, version = load_tags(tags_dir)
    require_tag_columns(tags, Path(tags_dir) / "tags.parquet")
    merged = merge_tags(split.items, tags, str(Path(tags_dir) / "tags.parquet"))
    atomic_write(Path(tags_dir) / TAGGED_ITEMS, lambda fh: merged.to_parquet(fh, index=False))
    filled = int(split.items["audience"].isna().sum() - merged["audience"].isna().sum())
    return {"items": len(merged), "audience_filled": filled, "fallbacks": int(tags["fallback"].sum()),
            "schema_hash": version["schema_hash"], "path": str(Path(tags_dir) / TAGGED_ITEMS)}

