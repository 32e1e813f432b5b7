"""Toy-sized real objects for the two-tower tests: a successor dataset and a tiny config.

``successor_split`` is a catalog of ``n_items`` items in a ring where every user watches a
run of consecutive items (item i is always followed by item i+1 mod n), so the next item
is known by hand: a sequence model must learn it, popularity cannot (all items are equally
popular).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from offline.protocol import make_split
from offline.schema import Dataset
from offline.split import Split
from recall.config import RecallConfig

GENRES = ("Action", "Comedy", "Drama")


def successor_split(n_items: int = 30, n_users: int = 90, length: int = 12) -> Split:
    rows = []
    for u in range(n_users):
        start = u % n_items
        for t in range(length):
            rows.append((f"u{u}", f"i{(start + t) % n_items}", 4.0, 1000 * u + t))
    inter = pd.DataFrame(rows, columns=["user_id", "item_id", "rating", "timestamp"])
    items = pd.DataFrame({
        "item_id": [f"i{i}" for i in range(n_items)],
        "title": [f"Film number {i}" for i in range(n_items)],
        "categories": [[GENRES[i % 3]] for i in range(n_items)],
        "audience": ["all" if i % 2 else "adult" for i in range(n_items)],
        "year": [1960 + i for i in range(n_items)],
    })
    users = pd.DataFrame({
        "user_id": [f"u{u}" for u in range(n_users)],
        "age": [15 + u % 50 for u in range(n_users)],
        "gender": ["F" if u % 2 else "M" for u in range(n_users)],
        "occupation": [("writer", "nurse", None)[u % 3] for u in range(n_users)],
    })
    return make_split(Dataset(name="successor", interactions=inter, items=items, users=users), k_core=5)


def tiny_config(**overrides: object) -> RecallConfig:
    base: dict[str, object] = dict(
        dim=16, max_len=8, n_blocks=1, n_heads=2, dropout=0.1, lr=1e-2, batch_size=32,
        max_epochs=40, eval_every=5, patience=2, use_text=False, temperature=0.1, train_threads=1,
    )
    return RecallConfig(**{**base, **overrides})


def successor_of(history: np.ndarray, n_items: int) -> int:
    return int((history[-1] + 1) % n_items)
