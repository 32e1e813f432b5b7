"""PopularityChannel ordering/exclusion and merge_channels interleave, de-dup, flags, quotas, exclusion."""

from __future__ import annotations

import numpy as np
import pytest

from recall.channels import PopularityChannel, clean_channel, merge_channels

NAN = np.nan


def ids(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=np.int64)


def f32(*xs: float) -> np.ndarray:
    return np.array(xs, dtype=np.float32)


def desc(n: int) -> np.ndarray:
    return np.linspace(1.0, 0.1, n, dtype=np.float32)


def test_popularity_orders_by_count_ties_to_lower_index_and_excludes() -> None:
    channel = PopularityChannel(np.array([5, 9, 9, 1, 0, 9]))
    got, scores = channel.candidates(exclude=ids(2), n=3)
    assert got.tolist() == [1, 5, 0]
    assert scores.tolist() == [9.0, 9.0, 5.0]
    assert got.dtype == np.int64 and scores.dtype == np.float32
    assert channel.candidates(exclude=ids(), n=10)[0].tolist() == [1, 2, 5, 0, 3, 4]
    assert channel.candidates(exclude=ids(1, 2, 5, 0, 3, 4), n=2)[0].tolist() == []


def test_popularity_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="shape"):
        PopularityChannel(np.ones((2, 2)))
    with pytest.raises(ValueError, match="got -1"):
        PopularityChannel(np.ones(3)).candidates(ids(), -1)


def test_round_robin_dedups_and_flags_every_source() -> None:
    merged = merge_channels(
        [
            ("ann", ids(4, 7, 2, 8), np.array([0.9, 0.8, 0.7, 0.6], dtype=np.float32)),
            ("popularity", ids(7, 9, 1), np.array([50, 40, 30], dtype=np.float32)),
        ],
        depth=10,
        exclude=ids(),
    )
    assert merged.items.tolist() == [4, 7, 2, 9, 8, 1]
    assert merged.order_by == "recall"
    np.testing.assert_allclose(merged.scores["recall"], 1 / np.arange(1, 7), rtol=1e-6)
    assert merged.flags["src_ann"].tolist() == [True, True, True, False, True, False]
    assert merged.flags["src_popularity"].tolist() == [False, True, False, True, False, True]
    np.testing.assert_array_equal(merged.scores["recall_ann"], f32(0.9, 0.8, 0.7, NAN, 0.6, NAN))
    np.testing.assert_array_equal(merged.scores["recall_popularity"], f32(NAN, 50, NAN, 40, NAN, 30))


def test_depth_truncates_the_merged_list() -> None:
    merged = merge_channels([("ann", ids(4, 7, 2), desc(3)), ("popularity", ids(7, 9), desc(2))], 3, ids())
    assert merged.items.tolist() == [4, 7, 2]
    assert merge_channels([("ann", ids(4, 7), desc(2))], 0, ids()).items.tolist() == []


def test_quota_spreads_a_channel_in_proportion_and_caps_it() -> None:
    # weights 12 vs 2: Sainte-Lague gives popularity slots 3 and 10, then its quota is spent
    merged = merge_channels(
        [("ann", np.arange(20), desc(20)), ("popularity", np.arange(100, 110), desc(10))],
        depth=12,
        exclude=ids(),
        quotas={"popularity": 2},
    )
    assert merged.items.tolist() == [0, 1, 2, 100, 3, 4, 5, 6, 7, 8, 101, 9]
    assert int(merged.flags["src_popularity"].sum()) == 2


def test_slots_left_after_every_quota_go_to_the_first_channel() -> None:
    merged = merge_channels(
        [("ann", ids(1, 2, 3, 4), desc(4)), ("popularity", ids(5, 6), desc(2))],
        depth=5,
        exclude=ids(),
        quotas={"ann": 2, "popularity": 1},
    )
    assert merged.items.tolist() == [1, 5, 2, 3, 4]


def test_zero_quota_channel_fills_no_slot_but_still_flags_its_items() -> None:
    merged = merge_channels(
        [("ann", ids(1, 2), desc(2)), ("popularity", ids(2, 9), f32(7, 6))],
        depth=5,
        exclude=ids(),
        quotas={"popularity": 0},
    )
    assert merged.items.tolist() == [1, 2]
    assert merged.flags["src_popularity"].tolist() == [False, True]
    np.testing.assert_array_equal(merged.scores["recall_popularity"], f32(NAN, 7))


def test_excluded_padding_and_repeated_items_are_dropped() -> None:
    merged = merge_channels(
        [
            ("ann", ids(3, -1, 3, 5), f32(0.9, -np.inf, 0.1, 0.5)),
            ("popularity", ids(5, 3, 6), f32(9, 8, 7)),
        ],
        depth=10,
        exclude=ids(5),
    )
    assert merged.items.tolist() == [3, 6]
    assert merged.flags["src_ann"].tolist() == [True, False]
    assert merged.flags["src_popularity"].tolist() == [True, True]
    # the first (best) occurrence of a repeated item is kept
    np.testing.assert_array_equal(merged.scores["recall_ann"], f32(0.9, NAN))
    np.testing.assert_array_equal(merged.scores["recall_popularity"], f32(8, 7))


def test_no_channels_give_an_empty_set() -> None:
    merged = merge_channels([], depth=5, exclude=ids(1))
    assert len(merged) == 0 and merged.scores["recall"].dtype == np.float32


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"depth": -1}, "depth must be >= 0, got -1"),
        ({"quotas": {"graph": 3}}, r"unknown channels \['graph'\]"),
        ({"quotas": {"ann": -2}}, r"\{'ann': -2\}"),
    ],
)
def test_bad_arguments_raise_naming_the_value(kwargs: dict, message: str) -> None:
    args = {"channels": [("ann", ids(1), desc(1))], "depth": 3, "exclude": ids(), **kwargs}
    with pytest.raises(ValueError, match=message):
        merge_channels(**args)


def test_bad_channels_raise_naming_the_channel() -> None:
    with pytest.raises(ValueError, match="must be unique"):
        merge_channels([("ann", ids(1), desc(1)), ("ann", ids(2), desc(1))], 3, ids())
    with pytest.raises(ValueError, match="'ann' has 2 ids but 1 scores"):
        merge_channels([("ann", ids(1, 2), desc(1))], 3, ids())


def test_priority_order_keeps_the_primary_channel_on_top():
    from recall.channels import merge_channels

    ann = ("ann", np.array([4, 7, 2, 8]), np.array([0.9, 0.8, 0.7, 0.6], dtype=np.float32))
    pop = ("popularity", np.array([7, 9, 1]), np.array([30, 20, 10], dtype=np.float32))
    quotas = {"ann": 3, "popularity": 2}
    prio = merge_channels([ann, pop], 5, np.array([], dtype=np.int64), quotas=quotas, order="priority")
    assert prio.items.tolist() == [4, 7, 2, 9, 1]
    assert prio.flags["src_popularity"].tolist() == [False, True, False, True, True]
    with pytest.raises(ValueError, match="order must be 'interleave' or 'priority'"):
        merge_channels([ann], 2, np.array([], dtype=np.int64), order="best")


@pytest.mark.parametrize("seed", range(5))
def test_clean_channel_with_a_blocked_mask_equals_the_set_look_up(seed):
    rng = np.random.default_rng(seed)
    raw = rng.integers(-1, 40, 60)  # padding and repeats included
    scores = rng.random(60).astype(np.float32)
    exclude = rng.integers(0, 60, 15)  # some beyond every id
    blocked = np.zeros(40, dtype=bool)
    blocked[exclude[exclude < 40]] = True
    by_set = clean_channel(raw, scores, exclude, "c")
    by_mask = clean_channel(raw, scores, exclude, "c", blocked=blocked)
    assert by_set[0].tolist() == by_mask[0].tolist() and by_set[1].tolist() == by_mask[1].tolist()
    assert not np.isin(by_mask[0], exclude).any() and len(set(by_mask[0].tolist())) == len(by_mask[0])
