"""Toy-size real objects for the tagging tests: a catalog split of any size and a tiny LLM on disk."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd

from offline.schema import Vocab, normalise_items, normalise_users
from offline.split import Split
from tests.llm_rerank.factories import ANIMATION, HORROR, save_tiny_llm


def catalog_split(n_items: int = 12, n_users: int = 6) -> Split:
    """``n_items`` movies alternating Animation / Horror titles; each user watches one genre in order."""
    titles = [f"{(ANIMATION if i % 2 == 0 else HORROR)[(i // 2) % 6][:-7]} {i} (199{i % 10})" for i in range(n_items)]
    cats = [["Animation", "Children's"] if i % 2 == 0 else ["Horror"] for i in range(n_items)]
    items = normalise_items(pd.DataFrame({
        "item_id": [f"i{i}" for i in range(n_items)], "title": titles,
        "text": [f"{t}. Genres: {', '.join(c)}." for t, c in zip(titles, cats, strict=True)], "categories": cats}))
    users = normalise_users(pd.DataFrame({"user_id": [f"u{u}" for u in range(n_users)]}))
    rows = []
    for u in range(n_users):
        watched = list(range(u % 2, n_items, 2))
        rows += [(u, i, 4.0, 1000 * u + t) for t, i in enumerate(watched[:-1])]
    train = pd.DataFrame(rows, columns=["user_idx", "item_idx", "rating", "timestamp"])
    held = np.array([list(range(u % 2, n_items, 2))[-1] for u in range(n_users)], dtype=np.int64)
    return Split(name="toy-catalog", vocab=Vocab.build(users["user_id"], items["item_id"]), items=items,
                 users=users, train=train, valid=held, test=held, valid_ts=np.full(n_users, 10**6, dtype=np.int64),
                 test_ts=np.full(n_users, 10**6 + 1, dtype=np.int64), protocol={"split": "toy"})


@functools.lru_cache(maxsize=1)
def tiny_model_dir() -> Path:
    """A tiny random Llama of SmolLM2's architecture saved once per test session."""
    import tempfile

    return save_tiny_llm(Path(tempfile.mkdtemp(prefix="tiny-tagger-")))


def prepared_again(split: Split) -> Split:
    """The same data prepared again with the items in reverse order (item_idx i becomes n-1-i),
    as ``recsys prepare`` gives for a catalog file whose rows were reordered."""
    n = split.n_items
    items = split.items.iloc[::-1].reset_index(drop=True)
    train = split.train.assign(item_idx=n - 1 - split.train["item_idx"])
    return Split(name=split.name, vocab=Vocab.build(split.users["user_id"], items["item_id"]), items=items,
                 users=split.users, train=train, valid=n - 1 - split.valid, test=n - 1 - split.test,
                 valid_ts=split.valid_ts, test_ts=split.test_ts, protocol=split.protocol)
