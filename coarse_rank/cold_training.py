"""Cold-item training: how the coarse ranker learns to rank items it holds no interaction of.

A new item reaches the ranker with every interaction feature unknown (``FeatureBuilder.hide_interactions``).
Two methods show the ranker such rows in training, each fitted as one variant and served per catalog only
where it beats training without them on the valid groups (``coarse_rank.gates.choose_dropout``):

- dropout: a seeded random share of the items has its interaction features hidden in every row;
- young copies: every row is kept, and each train group holding one of the youngest share of the known
  items is appended again with those items' interactions hidden.

``cold_item_variants`` lists the (dropout, young copies) pairs a configuration fits, ``variant_label``
names one in the training report, ``cold_items_for_training`` builds a variant's training rows.

Deliberately left out: the fits and the choice among them (``coarse_rank.train``, ``coarse_rank.gates``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from coarse_rank.config import CoarseConfig
from coarse_rank.dataset import QueryGroups
from coarse_rank.features import FeatureBuilder

# coarse.cold_item_dropout and coarse.young_item_copies null: the shares tried, 0 first (the incumbent
# choose_dropout serves unless beaten). Three fits in all (cold_item_variants): none, young copies, dropout.
COLD_ITEM_DROPOUTS = (0.0, 0.1)
YOUNG_ITEM_COPIES = (0.0, 0.1)


def cold_item_variants(config: CoarseConfig) -> list[tuple[float, float]]:
    """The (cold_item_dropout, young_item_copies) pairs training fits, the incumbent (0, 0) first when
    either is chosen on valid: each null setting contributes its shares, one cold-item method at a time.

    >>> cold_item_variants(CoarseConfig())
    [(0.0, 0.0), (0.0, 0.1), (0.1, 0.0)]
    >>> cold_item_variants(CoarseConfig(cold_item_dropout=0.1, young_item_copies=0.2))
    [(0.1, 0.2)]
    """
    dropouts = COLD_ITEM_DROPOUTS if config.cold_item_dropout is None else (config.cold_item_dropout,)
    copies = YOUNG_ITEM_COPIES if config.young_item_copies is None else (config.young_item_copies,)
    fixed = len(dropouts) == 1 and len(copies) == 1
    return [(d, c) for d in dropouts for c in copies if fixed or d == 0 or c == 0]


def variant_label(variant: tuple[float, float]) -> float | str:
    """How the report names a cold-item variant: its dropout share, or the young copies' share.

    >>> variant_label((0.1, 0.0)), variant_label((0.0, 0.1)), variant_label((0.1, 0.2))
    (0.1, 'young 0.1', 'dropout 0.1 + young 0.2')
    """
    d, c = variant
    if c == 0:
        return d
    return f"young {c:g}" if d == 0 else f"dropout {d:g} + young {c:g}"


def cold_items_for_training(x: np.ndarray, groups: QueryGroups, known: np.ndarray, builder: FeatureBuilder,
                            dropout: float, seed: int, young: float = 0.0
                            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """Training rows ready for new items: (x, int labels, group sizes, counts for the report).

    A candidate item with no interaction anywhere in training (``known`` false: a new item of
    the cold-item protocol) is dropped from its group unless it is the label: it is unknown,
    not a negative. The interaction features of a seeded random ``dropout`` share of the items
    are hidden in every row of those items (``FeatureBuilder.hide_interactions``), as a new
    item's are at serving, so the ranker learns to order such items by what they still have.

    ``young`` > 0 keeps every row as it is and appends a copy of each group that holds one of the
    youngest ``young`` share of the known items (by ``item_age``: first seen last), with those items'
    interactions hidden in the copy. A new item at serving is what a young item was when it arrived,
    and the copies show the ranker how often such an item is the one picked, in its own groups,
    while the originals keep everything the warm items teach (random ``dropout`` hides warm
    evidence from the only rows it has). Without item ages (``coarse.item_age_features`` off) no
    copy is made and the report says so.

    >>> from recsys.contract import Candidates
    >>> g = QueryGroups("train", [None, None], [Candidates(np.array([0, 1, 2])),
    ...                  Candidates(np.array([2, 3]))], np.array([1, 3]))
    >>> x, y, sizes, info = cold_items_for_training(np.ones((5, 2), np.float32), g, np.array([1, 1, 0, 1], bool),
    ...                                            FeatureBuilder(), 0.0, 0)
    >>> y.tolist(), sizes.tolist(), info["dropped_unknown_rows"]
    ([0, 1, 1], [2, 1], 2)
    """
    items = np.concatenate([c.items for c in groups.candidates]) if len(groups) else np.zeros(0, np.int64)
    y = groups.relevance().astype(np.int32)
    keep = known[items] | (y > 0)
    owner = np.repeat(np.arange(len(groups)), groups.sizes)
    hidden_items = np.flatnonzero(np.random.default_rng(seed).random(len(known)) < dropout)
    x = x[keep]
    masked = np.isin(items[keep], hidden_items)
    builder.hide_interactions(x, masked)
    sizes = np.bincount(owner[keep], minlength=len(groups))
    info: dict[str, Any] = {"dropped_unknown_rows": int((~keep).sum()), "hidden_items": int(len(hidden_items)),
            "hidden_rows": int(masked.sum()), "dropout": dropout}
    y = y[keep]
    if young > 0:
        x, y, sizes, info["young_copies"] = _young_copies(x, y, sizes, items[keep], known, builder, young)
    return x, y, sizes, info


def _young_copies(x: np.ndarray, y: np.ndarray, sizes: np.ndarray, items: np.ndarray, known: np.ndarray,
                  builder: FeatureBuilder, share: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """``cold_items_for_training``'s masked copies: (x, y, sizes) with the copies appended, and their counts."""
    if builder.age is None:
        return x, y, sizes, {"share": share, "skipped": "no item ages (coarse.item_age_features is off)"}
    age = np.where(known, np.nan_to_num(builder.age.age[:len(known)], nan=np.inf), np.inf)
    n_young = int(np.ceil(share * known.sum()))
    youngest = np.argsort(age, kind="stable")[:n_young]
    is_young = np.isin(items, youngest)
    owner = np.repeat(np.arange(len(sizes)), sizes)
    copied = np.flatnonzero(np.bincount(owner[is_young], minlength=len(sizes)) > 0)
    rows = np.isin(owner, copied)
    x_copy = x[rows].copy()
    builder.hide_interactions(x_copy, is_young[rows])
    info = {"share": share, "young_items": n_young, "copied_groups": int(len(copied)),
            "copied_rows": int(rows.sum()), "young_positives": int((y[rows] > 0)[is_young[rows]].sum())}
    return np.vstack([x, x_copy]), np.concatenate([y, y[rows]]), np.concatenate([sizes, sizes[copied]]), info
