"""Toy-size real objects for the coarse-ranker tests: hand-built splits and a candidate stage.

``split_from_sequences`` builds a leave-one-out ``Split`` directly (last item -> test,
second last -> valid) so the feature tests can check values by hand. ``PopularityStage`` is
a real, deterministic recall stage (every unseen item, scored by training popularity);
``chain_split`` makes users walk item i -> i+1 most of the time, so the next item is
predictable from the "follow" features but not from popularity.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from offline.schema import Vocab, normalise_items, normalise_users
from offline.split import Split
from tests.doubles import PopularityStage as DoublePopularity


def split_from_sequences(
    sequences: list[list[int]],
    items: pd.DataFrame,
    users: pd.DataFrame,
    timestamps: list[list[int]] | None = None,
    ratings: list[list[float]] | None = None,
) -> Split:
    """Leave-one-out split of full per-user sequences (each >= 3 items)."""
    rows = []
    for u, seq in enumerate(sequences):
        ts = timestamps[u] if timestamps else list(range(1, len(seq) + 1))
        rt = ratings[u] if ratings else [4.0] * len(seq)
        rows += [(u, i, r, t) for i, r, t in zip(seq, rt, ts, strict=True)]
    df = pd.DataFrame(rows, columns=["user_idx", "item_idx", "rating", "timestamp"])
    df["rating"] = df["rating"].astype(np.float32)
    last = df.groupby("user_idx").cumcount(ascending=False)
    hold = df[last < 2].sort_values(["user_idx", "timestamp"])
    items = normalise_items(items)
    users = normalise_users(users)
    return Split(
        name="toy", vocab=Vocab.build(users["user_id"], items["item_id"]), items=items, users=users,
        train=df[last >= 2].reset_index(drop=True),
        valid=hold.groupby("user_idx")["item_idx"].first().to_numpy(np.int64),
        test=hold.groupby("user_idx")["item_idx"].last().to_numpy(np.int64),
        valid_ts=hold.groupby("user_idx")["timestamp"].first().to_numpy(np.int64),
        test_ts=hold.groupby("user_idx")["timestamp"].last().to_numpy(np.int64),
    )


def chain_split(n_users: int = 160, n_items: int = 30, follow_prob: float = 0.85, seed: int = 0) -> Split:
    """Users walk i -> i+1 (mod n_items) with ``follow_prob``, else jump to a random unseen item."""
    rng = np.random.default_rng(seed)
    seqs, stamps = [], []
    for u in range(n_users):
        seq = [int(rng.integers(n_items))]
        for _ in range(int(rng.integers(6, 11)) - 1):
            nxt = (seq[-1] + 1) % n_items
            if nxt in seq or rng.random() > follow_prob:
                nxt = int(rng.choice([i for i in range(n_items) if i not in seq]))
            seq.append(nxt)
        seqs.append(seq)
        stamps.append([1_000_000 + u * 50_000 + 3_600 * j for j in range(len(seq))])
    items = pd.DataFrame({
        "item_id": [f"i{i}" for i in range(n_items)],
        "categories": [[f"g{i % 4}"] for i in range(n_items)],
        "year": [1990 + i for i in range(n_items)],
        "audience": [["all", "teen", "adult"][i % 3] for i in range(n_items)],
    })
    users = pd.DataFrame({
        "user_id": [f"u{u}" for u in range(n_users)],
        "age": [int(a) for a in rng.integers(15, 60, size=n_users)],
        "gender": [["M", "F"][u % 2] for u in range(n_users)],
        "occupation": [["student", "writer", "other"][u % 3] for u in range(n_users)],
    })
    return split_from_sequences(seqs, items, users, stamps)


class PopularityStage(DoublePopularity):
    """The recall stage coarse training reads: popularity with its channel column (``tests.doubles``)."""

    def __init__(self, split: Split, depth: int = 200) -> None:
        super().__init__(split.item_popularity("valid"), name="recall", depth=depth, channel_column=True)
