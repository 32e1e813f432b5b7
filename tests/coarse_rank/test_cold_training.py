"""Cold-item training rows: young copies keep the originals and hide the youngest items in a copy; the variants fitted."""

from __future__ import annotations

import numpy as np

from coarse_rank.cold_training import cold_item_variants, cold_items_for_training
from coarse_rank.config import CoarseConfig
from coarse_rank.dataset import QueryGroups
from coarse_rank.features import FeatureBuilder
from coarse_rank.item_age import ItemAge
from recsys.contract import Candidates


def _toy_rows(builder):
    """Two groups over items 0-3 (item 2 the youngest), one row per candidate, every column 1."""
    groups = QueryGroups("train", [None, None], [Candidates(np.array([0, 1, 2])), Candidates(np.array([0, 3]))],
                         np.array([2, 0]))
    x = np.ones((5, len(builder.feature_names)), np.float32)
    return x, groups


def test_young_copies_append_masked_copies_of_the_groups_holding_the_youngest_items():
    builder = FeatureBuilder(CoarseConfig(channel_features=False))
    builder.age = ItemAge(np.array([0.9, 0.5, 0.0, 0.7], np.float32), np.zeros(4, np.float32))
    x, groups = _toy_rows(builder)
    known = np.ones(4, bool)
    out, y, sizes, info = cold_items_for_training(x, groups, known, builder, 0.0, seed=0, young=0.25)
    assert sizes.tolist() == [3, 2, 3] and y.tolist() == [0, 0, 1, 1, 0, 0, 0, 1]
    assert np.array_equal(out[:5], x)  # the original rows are untouched
    pop = builder.feature_names.index("item_log_pop")
    assert np.isnan(out[7, pop]) and not np.isnan(out[5:7, pop]).any()  # only the young item is hidden in the copy
    assert info["young_copies"] == {"share": 0.25, "young_items": 1, "copied_groups": 1, "copied_rows": 3,
                                    "young_positives": 1}


def test_young_copies_need_item_ages():
    builder = FeatureBuilder(CoarseConfig(channel_features=False, item_age_features=False))
    x, groups = _toy_rows(builder)
    out, _, sizes, info = cold_items_for_training(x, groups, np.ones(4, bool), builder, 0.0, seed=0, young=0.1)
    assert len(out) == 5 and sizes.tolist() == [3, 2] and "no item ages" in info["young_copies"]["skipped"]


def test_the_cold_item_variants_try_one_method_at_a_time_with_none_first():
    assert cold_item_variants(CoarseConfig()) == [(0.0, 0.0), (0.0, 0.1), (0.1, 0.0)]
    assert cold_item_variants(CoarseConfig(young_item_copies=0.0)) == [(0.0, 0.0), (0.1, 0.0)]
    assert cold_item_variants(CoarseConfig(cold_item_dropout=0.0)) == [(0.0, 0.0), (0.0, 0.1)]
    assert cold_item_variants(CoarseConfig(cold_item_dropout=0.0, young_item_copies=0.0)) == [(0.0, 0.0)]
