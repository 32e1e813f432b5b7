"""Items the coarse ranker has no evidence on keep the place recall gave them."""

from __future__ import annotations

import numpy as np
import pytest

from coarse_rank.new_items import recall_order_positions, recall_places


def _order(scores: np.ndarray) -> list[int]:
    key = np.where(np.isnan(scores), -np.inf, scores.astype(np.float32))  # as Candidates sorts them
    return list(np.argsort(-key, kind="stable"))


def test_unknown_items_land_at_their_recall_position_and_known_ones_keep_the_model_order() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 60))
        coarse = rng.normal(size=n)
        recall = rng.normal(size=n)
        recall[rng.random(n) < 0.1] = np.nan
        unknown = rng.random(n) < 0.3
        placed = recall_places(coarse, recall, unknown)
        order = _order(placed)
        movable = unknown & ~np.isnan(recall)
        if movable.all():
            assert np.array_equal(placed, coarse)
            continue
        for item in np.flatnonzero(movable):
            assert order.index(item) == recall_order_positions(recall)[item]
        known = [i for i in order if not movable[i]]
        assert known == _order(np.where(movable, np.nan, coarse))[:len(known)]
        np.testing.assert_array_equal(placed[~movable], coarse[~movable])


def test_without_unknown_items_the_scores_are_the_models() -> None:
    coarse = np.array([0.2, 0.9, -0.1])
    out = recall_places(coarse, np.array([1.0, 2.0, 3.0]), np.zeros(3, dtype=bool))
    assert np.array_equal(out, coarse) and out is not coarse


def test_an_unknown_item_recall_did_not_score_stays_where_the_model_put_it() -> None:
    coarse = np.array([3.0, 2.0, 1.0])
    out = recall_places(coarse, np.array([0.5, np.nan, 0.2]), np.array([False, True, False]))
    assert np.array_equal(out, coarse)


@pytest.mark.parametrize("run", [1, 3])
def test_runs_of_unknown_items_between_known_ones_sort_strictly_in_float32(run: int) -> None:
    n = 10
    coarse = np.linspace(1.0, 1.0 + 1e-4, n)[::-1].copy()  # close scores, as a flat booster gives
    recall = -np.arange(n, dtype=np.float64)  # recall order = input order
    unknown = np.zeros(n, dtype=bool)
    unknown[4:4 + run] = True
    order = _order(recall_places(coarse, recall, unknown))
    assert order == list(range(n))
