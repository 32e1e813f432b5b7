"""Item attributes as flat numpy arrays, so rules evaluate over candidate arrays without Python loops.

``ItemAttributes.from_items`` turns the canonical items table (``offline.schema``) into:
audience codes (index into ``AUDIENCES``, -1 = unknown), risk levels (-1 = unknown), a
multi-hot category matrix and a multi-hot tag matrix (tags from the ``attributes`` JSON key
``"tags"``, where an LLM tagging job writes them; ``tags_known`` is False where that JSON is
malformed). Row ``i`` is ``item_idx`` ``i``.

Deliberately left out: what the rules do with these arrays (``rules.engine``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from offline.schema import AUDIENCES
from recsys.names import canonical, id_index

UNKNOWN = -1


@dataclass(frozen=True)
class ItemAttributes:
    item_ids: np.ndarray  # [n] object, external ids
    audience: np.ndarray  # [n] int8, index into AUDIENCES or UNKNOWN
    risk_level: np.ndarray  # [n] int16, 0..3 or UNKNOWN
    categories: np.ndarray  # [n, n_categories] bool
    category_names: tuple[str, ...]
    tags: np.ndarray  # [n, n_tags] bool
    tag_names: tuple[str, ...]
    tags_known: np.ndarray  # [n] bool
    _id_index: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.item_ids)

    @classmethod
    def from_items(cls, items: pd.DataFrame) -> ItemAttributes:
        """Build from a canonical items table (``Split.items``: row i is item_idx i)."""
        missing = [c for c in ("item_id", "categories", "audience", "risk_level") if c not in items.columns]
        if missing:
            raise ValueError(f"items table lacks column(s) {missing} needed by the rules")
        n = len(items)
        code = {a: i for i, a in enumerate(AUDIENCES)}
        audience = np.array([code.get(a, UNKNOWN) if isinstance(a, str) else UNKNOWN for a in items["audience"]],
                            dtype=np.int8)
        risk = pd.to_numeric(items["risk_level"], errors="coerce").astype("Int64").fillna(UNKNOWN)
        categories, category_names = _multi_hot([_as_list(c) for c in items["categories"]])
        attrs = items["attributes"] if "attributes" in items.columns else pd.Series(["{}"] * n)
        tag_lists, tags_known = _tags(attrs)
        tags, tag_names = _multi_hot(tag_lists)
        ids = np.asarray(items["item_id"].astype(str), dtype=object)
        return cls(
            item_ids=ids, audience=audience, risk_level=risk.to_numpy(np.int16),
            categories=categories, category_names=category_names,
            tags=tags, tag_names=tag_names, tags_known=tags_known,
            _id_index=id_index(ids),  # also in NFC, as rule documents spell them
        )

    def indices_of(self, item_ids: Iterable[str]) -> np.ndarray:
        """Item indices of the known external ids among ``item_ids`` (unknown ids are skipped)."""
        found = [self._id_index[i] for i in item_ids if i in self._id_index]
        return np.asarray(found, dtype=np.int64)

    def category_columns(self, names: Sequence[str]) -> np.ndarray:
        return _columns(self.category_names, names)

    def tag_columns(self, names: Sequence[str]) -> np.ndarray:
        return _columns(self.tag_names, names)


def _as_list(value: object) -> list[str]:
    if value is None or isinstance(value, float) and np.isnan(value):
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]  # type: ignore[attr-defined]


def _columns(columns: Sequence[str], names: Sequence[str]) -> np.ndarray:
    """Positions of ``names`` among ``columns`` (rules look these up per request: one set, not one per column)."""
    wanted = set(names)
    return np.asarray([i for i, c in enumerate(columns) if c in wanted], dtype=np.int64)


def _multi_hot(lists: list[list[str]]) -> tuple[np.ndarray, tuple[str, ...]]:
    """Rows x names, the names in NFC as rule documents hold them (``rules.schema``): tags as an LLM or
    a file wrote them, categories of a split saved before they were NFC: both spellings one column."""
    lists = [[canonical(name) for name in row] for row in lists]
    names = tuple(sorted({name for row in lists for name in row}))
    col = {name: j for j, name in enumerate(names)}
    matrix = np.zeros((len(lists), len(names)), dtype=bool)
    for i, row in enumerate(lists):
        matrix[i, [col[name] for name in row]] = True
    return matrix, names


def _tags(attributes: pd.Series) -> tuple[list[list[str]], np.ndarray]:
    lists: list[list[str]] = []
    known = np.ones(len(attributes), dtype=bool)
    for i, raw in enumerate(attributes):
        try:
            parsed = json.loads(raw) if isinstance(raw, str) and raw else {}
            tags = parsed.get("tags", []) if isinstance(parsed, dict) else None
            if not isinstance(tags, list):
                raise ValueError("'tags' must be a list")
            lists.append([str(t) for t in tags])
        except (ValueError, TypeError):
            known[i] = False  # malformed attributes: tag rules treat this item as unknown (fail closed)
            lists.append([])
    return lists, known
