"""A toy catalog whose rule outcomes are known by hand (row i == item_idx i)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from offline.schema import normalise_items
from rules.items import ItemAttributes

# item_idx: (item_id, categories, audience, risk_level, tags or None for malformed attributes)
TOY = [
    ("a", ["Comedy"], "all", 0, []),
    ("b", ["Horror"], "adult", 1, []),
    ("c", ["Drama"], "teen", 2, ["gambling"]),
    ("d", ["Drama", "Horror"], "all", 3, []),
    ("e", ["Comedy"], None, 0, []),  # audience unknown
    ("f", ["Drama"], "all", None, []),  # risk level unknown
    ("g", ["Drama"], "all", 0, None),  # malformed attributes JSON: tags unknown
    ("h", ["Comedy"], "teen", 1, []),
]


def toy_items_table() -> pd.DataFrame:
    return normalise_items(pd.DataFrame({
        "item_id": [t[0] for t in TOY],
        "title": [f"Item {t[0]}" for t in TOY],
        "categories": [t[1] for t in TOY],
        "audience": [t[2] for t in TOY],
        "risk_level": pd.array([t[3] for t in TOY], dtype="Int64"),
        "attributes": ["{not json" if t[4] is None else json.dumps({"tags": t[4]}) for t in TOY],
    }))


@pytest.fixture
def toy_items() -> ItemAttributes:
    return ItemAttributes.from_items(toy_items_table())
