"""Where the coarse ranker puts items it has no interaction evidence on: the place recall gave them.

The ranker orders candidates mostly by what their interactions say (popularity, follow counts, the
neighbour channels' scores). An item the fitted tables hold no interaction of (one added to the
catalog after training, or first seen after the training cutoff) has all of those unknown, so the
ranker pushes it below every item that has some evidence, whatever its recall score. On a catalog
where people pick new items, that buries the items recall had found: on ML-100K's time-based
cold-item protocol the two-tower's top 200 held 34.5 new items a user and the ranker's top 50 kept
2.9 (new-item slice NDCG@10: recall 0.066, coarse 0.015).

``recall_places`` leaves the ranker's order of the items it knows untouched and moves each unknown
item to the position recall ranked it at among the request's candidates: the two-tower, which reads
an item's text and categories as well as its id, is the stage whose judgement of a new item has
evidence behind it. Warm items keep their scores (fusion reads them); an unknown item gets a score
between its new neighbours'. Where no candidate is unknown, the scores are returned unchanged, so a
catalog without new items ranks exactly as the model does.

Whether a catalog is served that way is chosen on its valid groups when the ranker is trained
(``coarse.new_items: auto``, ``coarse_rank.train``): recall's place wins only where it beats the
model's order beyond the paired CI. On ML-100K's cold-item protocol it lifts the new-item slice to
recall's own NDCG@10 (+0.051, CI +0.024 to +0.083) but costs the other 87% of users 0.018 (CI
-0.024 to -0.014), -0.010 over all users: there the model's order stays.

Deliberately left out: blending the two orders for items with a little evidence (a handful of
interactions); the ranker sees those counts and learns what they are worth.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_STEP = 1e-3  # score gap per slot for unknown items above the best or below the worst known item


def recall_order_positions(recall: np.ndarray) -> np.ndarray:
    """Each candidate's 0-based position in the recall order (descending score, NaN last, stable).

    >>> recall_order_positions(np.array([0.1, np.nan, 0.9, 0.5]))
    array([2, 3, 0, 1])
    """
    key = np.where(np.isnan(recall), -np.inf, recall)
    pos = np.empty(len(recall), dtype=np.int64)
    pos[np.argsort(-key, kind="stable")] = np.arange(len(recall))
    return pos


def recall_places(coarse: np.ndarray, recall: np.ndarray, unknown: np.ndarray) -> np.ndarray:
    """``coarse`` scores with every ``unknown`` item that recall scored re-scored so that sorting by
    them (descending, stable) puts it at its recall position; known items keep their scores.

    >>> recall_places(np.array([3.0, 2.0, 1.0, 0.0]), np.array([0.4, 0.3, 0.9, 0.1]),
    ...               np.array([False, False, True, False]))
    array([3.   , 2.   , 3.001, 0.   ])
    """
    coarse = np.asarray(coarse, dtype=np.float64)
    movable = unknown & ~np.isnan(recall)
    if not movable.any() or movable.all():
        return coarse.copy()
    known = np.flatnonzero(~movable)
    known = known[np.argsort(-np.where(np.isnan(coarse[known]), -np.inf, coarse[known]), kind="stable")]
    places = recall_order_positions(recall)
    moved = np.flatnonzero(movable)
    moved = moved[np.argsort(places[moved], kind="stable")]
    order: list[int] = [int(i) for i in known]
    for item in moved:  # in recall order, each at its recall position among what is placed so far
        order.insert(min(int(places[item]), len(order)), int(item))
    return _scores_for_order(coarse, np.asarray(order), movable)


def _scores_for_order(coarse: np.ndarray, order: np.ndarray, movable: np.ndarray) -> np.ndarray:
    """Scores that sort into ``order``: known items keep theirs, each run of moved items is spaced
    evenly between the known scores around it."""
    out = coarse.copy()
    ranked = coarse[order]
    is_moved = movable[order]
    known_scores = np.where(is_moved, np.nan, ranked)
    i = 0
    while i < len(order):
        if not is_moved[i]:
            i += 1
            continue
        j = i
        while j < len(order) and is_moved[j]:
            j += 1
        above = known_scores[i - 1] if i > 0 else np.nan
        below = known_scores[j] if j < len(order) else np.nan
        run = j - i
        values: np.ndarray
        if np.isnan(above) and np.isnan(below):
            values = -np.arange(run, dtype=np.float64)
        elif np.isnan(above):
            values = below + _STEP * np.arange(run, 0, -1)
        elif np.isnan(below):
            values = above - _STEP * np.arange(1, run + 1)
        else:
            values = above - (above - below) * np.arange(1, run + 1) / (run + 1)
        out[order[i:j]] = values
        i = j
    return out


def unknown_mask(items: np.ndarray, known: np.ndarray) -> np.ndarray:
    """[len(items)] bool: the item has no interaction in the fitted tables (or lies past them).

    >>> unknown_mask(np.array([0, 1, 5]), np.array([True, False, True])).tolist()
    [False, True, True]
    """
    out = items >= len(known)
    out[~out] = ~known[items[~out]]
    return out


def placed_scores(scores: np.ndarray, items: Sequence[np.ndarray], recall: Sequence[np.ndarray],
                  known: np.ndarray) -> tuple[np.ndarray, int]:
    """``recall_places`` applied group by group to row-stacked ``scores`` (groups given by their
    ``items`` and ``recall`` scores); and how many groups held an unknown item."""
    out = np.asarray(scores, dtype=np.float64).copy()
    start, touched = 0, 0
    for its, rec in zip(items, recall, strict=True):
        end = start + len(its)
        unknown = unknown_mask(its, known)
        if unknown.any():
            out[start:end] = recall_places(out[start:end], np.asarray(rec, dtype=np.float64), unknown)
            touched += 1
        start = end
    return out, touched
