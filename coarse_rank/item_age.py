"""Item age and recent evidence: how long an item has been in the log and how much of its evidence is recent.

Popularity features count an item's interactions, so an item that arrived late ranks below one that
has had the whole log to accumulate them, even when people pick the newcomer now. On a catalog where
new releases carry the demand (films people tweet about, a shop's new stock) the ranker then buries
exactly the items users choose next. Two columns let it tell a young item rising from an old one
fading, on any time scale (both are shares, not days):

- ``item_age``: how long before the newest interaction of the fitted log the item was first seen, as
  a share of the log's time span (0 = it appeared with the newest events, 1 = with the oldest);
- ``item_recent_share``: the share of the item's interactions that fall among the log's newest
  ``RECENT_SHARE`` of events.

Both are unknown (NaN) for an item without interactions, like every interaction feature
(``feature_names.INTERACTION_FEATURES``). On a log whose timestamps only order each user's events
(no clock) they measure position, not time; the ranker then learns what they are worth there.

Saved with the fitted builder (``arrays`` / ``from_arrays`` inside ``features.npz``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

PREFIX = "itemage_"  # key prefix of the arrays inside features.npz
RECENT_SHARE = 0.2  # the newest share of the fitted log's events that count as recent

ITEM_AGE_FEATURES: dict[str, str] = {
    "item_age": "time from the item's first interaction to the newest one in training, as a share of the log's span",
    "item_recent_share": f"share of the item's interactions among the newest {RECENT_SHARE:.0%} of training events",
}


@dataclass(frozen=True)
class ItemAge:
    age: np.ndarray  # [n_items] float32, NaN without interactions
    recent_share: np.ndarray  # [n_items] float32, NaN without interactions

    @classmethod
    def fit(cls, items: np.ndarray, timestamps: np.ndarray, n_items: int) -> ItemAge:
        """The two columns' per-item values from a log's item indices and timestamps.

        >>> a = ItemAge.fit(np.array([0, 0, 1, 1]), np.array([0, 10, 8, 10]), 3)
        >>> a.age.tolist(), a.recent_share.tolist()[:2]
        ([1.0, 0.20000000298023224, nan], [0.5, 0.5])
        """
        items, ts = np.asarray(items, dtype=np.int64), np.asarray(timestamps, dtype=np.float64)
        counts = np.bincount(items, minlength=n_items).astype(np.float64)
        known = counts > 0
        age = np.full(n_items, np.nan)
        share = np.full(n_items, np.nan)
        if len(ts):
            first = np.full(n_items, np.inf)
            np.minimum.at(first, items, ts)
            span = float(ts.max() - ts.min())
            age[known] = (ts.max() - first[known]) / span if span > 0 else 0.0
            cut = np.quantile(ts, 1.0 - RECENT_SHARE)
            recent = np.bincount(items[ts >= cut], minlength=n_items).astype(np.float64)
            share[known] = recent[known] / counts[known]
        return cls(age.astype(np.float32), share.astype(np.float32))

    def columns(self, items: np.ndarray) -> list[np.ndarray]:
        """The ``ITEM_AGE_FEATURES`` columns of ``items`` (item_idx inside the fitted catalog)."""
        return [self.age[items], self.recent_share[items]]

    def arrays(self) -> dict[str, np.ndarray]:
        return {f"{PREFIX}age": self.age, f"{PREFIX}recent_share": self.recent_share}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], n_items: int) -> ItemAge:
        """Read back ``arrays``; a ValueError naming what is missing or of the wrong length."""
        missing = [k for k in (f"{PREFIX}age", f"{PREFIX}recent_share") if k not in arrays]
        if missing:
            raise ValueError(f"features.npz lacks the item-age arrays {missing}")
        age, share = np.asarray(arrays[f"{PREFIX}age"]), np.asarray(arrays[f"{PREFIX}recent_share"])
        if len(age) != n_items or len(share) != n_items:
            raise ValueError(f"item-age arrays have {len(age)}/{len(share)} rows, the catalog has {n_items} items")
        return cls(age.astype(np.float32), share.astype(np.float32))
