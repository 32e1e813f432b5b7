"""Feature values checked by hand on a three-user, five-item split."""

from __future__ import annotations

import doctest
import json

import numpy as np
import pandas as pd
import pytest
from scipy import sparse

from coarse_rank import features as feature_module
from coarse_rank import statistics
from coarse_rank.config import CoarseConfig
from coarse_rank.dataset import prefix_popularity, training_prefix
from coarse_rank.feature_names import FEATURES
from coarse_rank.feature_store import load_builder, save_builder
from coarse_rank.features import FeatureBuilder
from coarse_rank.item_age import ITEM_AGE_FEATURES
from recsys.contract import Candidates, Request
from tests.coarse_rank.toy import split_from_sequences

# train sequences: u0 [0,1,2], u1 [1,2,3], u2 [0,2,4] (the last two items of each go to valid/test)
SEQS = [[0, 1, 2, 3, 4], [1, 2, 3, 4, 0], [0, 2, 4, 1, 3]]
STAMPS = [[10, 20, 30, 40, 50], [15, 25, 35, 45, 55], [5, 6, 7, 8, 9]]
RATINGS = [[5, 3, 4, 1, 1], [2, 4, 1, 1, 1], [5, 5, 3, 1, 1]]
ITEMS = pd.DataFrame({
    "item_id": ["a", "b", "c", "d", "e"],
    "categories": [["A"], ["A", "B"], ["B"], [], ["C"]],
    "year": [1990, None, 1995, 2000, 1980],
    "audience": ["all", "adult", None, "teen", "all"],
})
USERS = pd.DataFrame({"user_id": ["u0", "u1", "u2"], "age": [20, 30, 22], "gender": ["M", "F", "M"],
                      "occupation": ["writer", "student", "writer"]})
WRITER_MAN = {"age": 20, "gender": "M", "occupation": "writer"}


@pytest.fixture()
def split():
    return split_from_sequences(SEQS, ITEMS, USERS, STAMPS, RATINGS)


def fitted(split, **cfg) -> FeatureBuilder:
    config = CoarseConfig(**{"cooc_window": 2, "last_n": 2, "attribute_prior": 0.0,  # the base features:
                             "recency_half_life_days": 10 / 86_400, "channel_features": False, **cfg})  # test_channel_features
    return FeatureBuilder(config).fit(split, score_columns=["recall_pop"], flag_columns=["src_pop"])


def features(fb: FeatureBuilder, history, items, recall=None, attrs=None) -> dict[str, np.ndarray]:
    items = np.asarray(items)
    scores = {} if recall is None else {"recall": np.asarray(recall, np.float32)}
    x = fb.transform(Request(user_id="x", history=np.asarray(history), user_attrs=attrs or {}),
                     Candidates(items=items, scores=scores))
    assert x.shape == (len(items), len(fb.feature_names)) and x.dtype == np.float32
    return {name: x[:, j] for j, name in enumerate(fb.feature_names)}


def test_statistics_doctests():
    assert doctest.testmod(statistics).failed == 0


def test_feature_names_are_stable_and_documented(split):
    fb = fitted(split)
    assert fb.feature_names == [*FEATURES, *ITEM_AGE_FEATURES, "recall_pop", "src_pop"]
    assert all(FEATURES[name] for name in FEATURES)
    assert fitted(split, item_age_features=False).feature_names == [*FEATURES, "recall_pop", "src_pop"]


def test_item_age_is_the_share_of_the_log_before_first_seen_and_recent_share_its_newest_events(split):
    # train events: item 0 at 10, 5; item 1 at 20, 15; item 2 at 30, 25, 6; item 3 at 35; item 4 at 7.
    # Span 5..35; the newest 20% of the 9 events are those at >= 27 (numpy's linear quantile): 30 and 35.
    f = features(fitted(split), history=[0], items=[0, 1, 2, 3, 4])
    np.testing.assert_allclose(f["item_age"], [1.0, 20 / 30, 29 / 30, 0.0, 28 / 30], rtol=1e-6)
    np.testing.assert_allclose(f["item_recent_share"], [0.0, 0.0, 1 / 3, 1.0, 0.0], rtol=1e-6)
    # an item without interactions (a new one) has both unknown, like every interaction feature
    fb = fitted(split)
    fb.tables.log_pop[3] = 0.0
    g = features(fb, history=[0], items=[3])
    assert np.isnan(g["item_age"]).all() and np.isnan(g["item_recent_share"]).all()


def test_follow_features_count_what_came_next_within_the_window(split):
    # window 2 over the train sequences: follow[0] = {1:1, 2:2, 4:1}, follow[1] = {2:2, 3:1},
    # follow[2] = {3:1, 4:1}; history [0, 2] -> last item 2, then 0.
    f = features(fitted(split), history=[0, 2], items=[1, 3, 4])
    np.testing.assert_allclose(f["follow_last"], [0, 1, 1])
    np.testing.assert_allclose(f["follow_last_norm"], [0, 0.5, 0.5])
    np.testing.assert_allclose(f["follow_recent_sum"], [1, 1, 2])
    np.testing.assert_allclose(f["follow_recent_max"], [1, 1, 1])
    np.testing.assert_allclose(f["precede_last"], [2, 0, 0])  # 1 -> 2 twice (u0, u1)
    np.testing.assert_allclose(f["hist_len"], [2, 2, 2])


def test_category_affinity_is_the_history_share_of_the_item_categories(split):
    # history [0, 4]: A = 1/2, B = 0, C = 1/2
    f = features(fitted(split), history=[0, 4], items=[1, 2, 3])
    np.testing.assert_allclose(f["cat_affinity_max"], [0.5, 0.0, np.nan])
    np.testing.assert_allclose(f["cat_affinity_mean"], [0.25, 0.0, np.nan])
    np.testing.assert_allclose(f["item_n_categories"], [2, 1, 0])


def test_item_features(split):
    f = features(fitted(split), history=[], items=[0, 1, 2, 3, 4])
    np.testing.assert_allclose(f["item_log_pop"], np.log1p([2, 2, 3, 1, 1]), rtol=1e-6)
    np.testing.assert_allclose(f["item_mean_rating"], [5, 2.5, 13 / 3, 1, 3], rtol=1e-6)
    np.testing.assert_allclose(f["item_year"], [1990, np.nan, 1995, 2000, 1980])
    np.testing.assert_allclose(f["item_audience"], [0, 2, np.nan, 1, 0])
    # half-life 10 s, latest train timestamp 35: item 2 was seen at 30, 25 and 6
    recent_2 = np.log1p(2**-0.5 + 2**-1.0 + 2**-2.9)
    assert f["item_recent_pop"][2] == pytest.approx(recent_2, rel=1e-6)
    assert f["item_recent_pop"][3] == pytest.approx(np.log1p(1.0))  # seen at 35 itself
    assert np.isnan(f["follow_last"]).all() and (f["hist_len"] == 0).all()  # no history: no evidence


def test_mean_rating_shrinks_toward_the_global_mean(split):
    f = features(fitted(split, attribute_prior=9.0), history=[], items=[3])
    glob = 32 / 9
    assert f["item_mean_rating"][0] == pytest.approx((1 + 9 * glob) / 10, rel=1e-6)


def test_user_attribute_crosses(split):
    f = features(fitted(split), history=[], items=[0, 1, 3], attrs=WRITER_MAN)
    # men (u0, u2) made 6 interactions: item 0 twice (2/6 vs 2/9 overall), item 3 never
    np.testing.assert_allclose(f["gender_item_lift"], [1.5, 0.75, 0.0], rtol=1e-6)
    np.testing.assert_allclose(f["age_item_lift"], [1.5, 0.75, 0.0], rtol=1e-6)  # 18-24 bracket = u0, u2
    np.testing.assert_allclose(f["occupation_item_lift"], [1.5, 0.75, 0.0], rtol=1e-6)
    assert (f["user_age"] == 20).all() and (f["user_gender"] == 1).all() and (f["user_occupation"] == 1).all()
    woman = features(fitted(split), history=[], items=[1, 3], attrs={"gender": "F", "occupation": "pilot"})
    np.testing.assert_allclose(woman["gender_item_lift"], [1.5, 3.0], rtol=1e-6)
    assert np.isnan(woman["user_age"]).all() and np.isnan(woman["occupation_item_lift"]).all()


def test_recall_columns_and_missing_channels(split):
    f = features(fitted(split), history=[0], items=[2, 3, 4], recall=[0.5, 0.9, np.nan])
    np.testing.assert_allclose(f["recall_rank"], [1, 0, 2])
    np.testing.assert_allclose(f["recall_gap"], [-0.4, 0.0, np.nan], rtol=1e-6)
    assert np.isnan(f["recall_pop"]).all() and np.isnan(f["src_pop"]).all()  # channel absent: missing


def test_training_prefix_drops_each_users_last_train_item(split):
    prefix = training_prefix(split)
    assert prefix.groupby("user_idx")["item_idx"].apply(list).tolist() == [[0, 1], [1, 2], [0, 2]]
    fb = FeatureBuilder(CoarseConfig(cooc_window=1)).fit(split, prefix)
    f = features(fb, history=[1], items=[2, 3])
    # u1's 1 -> 2 remains, u0's label 2 is gone; item 3 has no interaction in the prefix: unknown
    np.testing.assert_allclose(f["follow_last"], [1, np.nan])


def test_an_item_without_interactions_has_unknown_interaction_features(split):
    from coarse_rank.feature_names import INTERACTION_FEATURES

    prefix = training_prefix(split)  # item 3 has no interaction here: a new item to this builder
    fb = FeatureBuilder(CoarseConfig()).fit(split, prefix)
    f = features(fb, history=[1], items=[2, 3])
    assert not fb.known_items()[3] and fb.known_items()[2]
    for name in INTERACTION_FEATURES:
        if name in f:
            assert np.isnan(f[name][1]), name
    assert f["item_log_pop"][0] > 0
    assert f["item_year"][1] == 2000 and f["item_n_categories"][1] == 0  # content columns stay as they are


def test_save_load_round_trip_gives_identical_features(split, tmp_path):
    fb = fitted(split)
    save_builder(fb, tmp_path)
    again = load_builder(tmp_path)
    req = Request(user_id="x", history=np.array([0, 2]), user_attrs=WRITER_MAN)
    cands = Candidates(items=np.array([1, 3, 4]), scores={"recall": np.array([3, 2, 1], np.float32)})
    np.testing.assert_array_equal(fb.transform(req, cands), again.transform(req, cands))
    assert again.feature_names == fb.feature_names and "item_age" in again.feature_names
    # a builder saved before the item-age columns existed (its config lacks the switch) loads without them
    old = fitted(split, item_age_features=False)
    save_builder(old, tmp_path / "old")
    meta = json.loads((tmp_path / "old" / "features.json").read_text())
    del meta["config"]["item_age_features"]
    (tmp_path / "old" / "features.json").write_text(json.dumps(meta))
    assert load_builder(tmp_path / "old").feature_names == old.feature_names


def test_bad_inputs_raise_with_the_bad_value(split):
    fb = fitted(split)
    with pytest.raises(ValueError, match="candidate item_idx 7"):
        features(fb, history=[0], items=[1, 7])
    with pytest.raises(RuntimeError, match="not fitted"):
        FeatureBuilder().transform(Request(user_id="x"), Candidates.empty())
    assert features(fb, history=[0], items=[])["recall"].shape == (0,)


def test_training_prefix_and_train_queries_with_several_positions(split):
    from coarse_rank.dataset import query_inputs

    seqs = split.train_sequences
    prefix = training_prefix(split, 2)
    for u, seq in enumerate(seqs):
        kept = prefix.loc[prefix["user_idx"] == u, "item_idx"].tolist()
        assert kept == seq[:-2].tolist()
    owners, histories, labels = query_inputs(split, "train", positions=2)
    for u, seq in enumerate(seqs):
        rows = [i for i, o in enumerate(owners) if o == u]
        expected = [(seq[:-j].tolist(), int(seq[-j])) for j in (1, 2) if len(seq) >= j + 1]
        assert [(histories[i].tolist(), int(labels[i])) for i in rows] == expected


def test_prefix_popularity_counts_every_train_event_but_the_train_labels(split):
    from coarse_rank.dataset import query_inputs

    for positions in (1, 2, 3, 5):  # train sequences hold 3 items: from 2 on, a user's first item is no label
        _, _, labels = query_inputs(split, "train", positions=positions)
        np.testing.assert_array_equal(prefix_popularity(split, positions), split.item_popularity("valid")
                                      - np.bincount(labels, minlength=split.n_items))
    assert training_prefix(split, 5)["item_idx"].tolist() == [s[0] for s in split.train_sequences]


def test_follow_block_lookup_is_scipys_slice_exactly():
    rng = np.random.default_rng(3)
    dense = (rng.random((60, 60)) < 0.1) * rng.integers(1, 9, (60, 60)).astype(np.float32)
    mat = sparse.csr_matrix(dense)
    for rows, cols in [(rng.integers(0, 60, 10), rng.integers(0, 60, 200)), (np.array([5]), np.arange(60)),
                       (np.array([7, 7]), np.array([], np.int64)), (np.array([], np.int64), np.array([1, 2]))]:
        got = feature_module._dense_block(mat, rows, cols)
        assert got.dtype == np.float32 and np.array_equal(got, mat[rows][:, cols].toarray())
    assert doctest.testmod(feature_module).failed == 0
