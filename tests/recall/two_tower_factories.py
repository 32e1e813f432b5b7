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


def valid_only_split(n_ring: int = 30, n_new: int = 6, per_new: int = 4, ring_users: int = 60) -> Split:
    """A ring of ``n_ring`` items plus ``n_new`` new items N_r that only valid and test items hold.

    For each r < n_new, ``per_new`` users go ``r-5 .. r`` then N_r (their *valid* item) then r+1,
    and ``per_new`` others go ``r-6 .. r-1`` then r (valid) then N_r (*test*): "after r comes N_r"
    is in no training sequence, only in the first group's valid items. A model that learnt from the
    valid items (``RecallConfig.refit``) ranks N_r first for the second group; one that did not
    has never trained on N_r at all. ``ring_users`` plain ring runs teach the ring itself.
    """
    seqs: list[list[str]] = [[f"i{(u + t) % n_ring}" for t in range(12)] for u in range(ring_users)]
    for r in range(n_new):
        run = [f"i{(r - 6 + t) % n_ring}" for t in range(7)]  # r-6 .. r
        seqs += [run[1:] + [f"n{r}", f"i{(r + 1) % n_ring}"] for _ in range(per_new)]
        seqs += [run + [f"n{r}"] for _ in range(per_new)]
    rows = [(f"u{u}", item, 4.0, 1000 * u + t) for u, seq in enumerate(seqs) for t, item in enumerate(seq)]
    inter = pd.DataFrame(rows, columns=["user_id", "item_id", "rating", "timestamp"])
    ids = [f"i{i}" for i in range(n_ring)] + [f"n{r}" for r in range(n_new)]
    items = pd.DataFrame({"item_id": ids, "title": [f"Film {i}" for i in ids],
                          "categories": [[GENRES[k % 3]] for k in range(len(ids))]})
    users = pd.DataFrame({"user_id": [f"u{u}" for u in range(len(seqs))]})
    return make_split(Dataset(name="valid-only", interactions=inter, items=items, users=users), k_core=5)
