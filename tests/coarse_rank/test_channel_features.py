"""Channel features (co-visitation, item model, per-channel ranks) by hand, and the gain table."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

from coarse_rank import channel_features
from coarse_rank.channel_features import CHANNEL_FEATURES
from coarse_rank.config import CoarseConfig
from coarse_rank.dataset import training_prefix
from coarse_rank.feature_names import FEATURES
from coarse_rank.feature_store import load_builder, save_builder
from coarse_rank.features import FeatureBuilder
from coarse_rank.item_age import ITEM_AGE_FEATURES
from coarse_rank.train import importance_table
from offline.item_neighbours import NeighbourChannel, ease
from recsys.contract import Candidates, Request
from tests.coarse_rank.test_features import ITEMS, RATINGS, SEQS, STAMPS, USERS
from tests.coarse_rank.toy import split_from_sequences

# train sequences (the last two items of SEQS go to valid/test): u0 [0,1,2], u1 [1,2,3], u2 [0,2,4]


@pytest.fixture()
def split():
    return split_from_sequences(SEQS, ITEMS, USERS, STAMPS, RATINGS)


def fitted(split, interactions=None) -> FeatureBuilder:
    config = CoarseConfig(channel_features=True, channel_window=1, channel_last_n=2, item_model_last_n=3)
    return FeatureBuilder(config).fit(split, interactions, score_columns=["recall_pop"], flag_columns=["src_pop"])


def columns(fb: FeatureBuilder, history, items, pop=None) -> dict[str, np.ndarray]:
    scores = {} if pop is None else {"recall_pop": np.asarray(pop, np.float32)}
    x = fb.transform(Request(user_id="x", history=np.asarray(history)), Candidates(items=np.asarray(items),
                                                                                  scores=scores))
    return {name: x[:, j] for j, name in enumerate(fb.feature_names)}


def test_docstring_examples() -> None:
    assert doctest.testmod(channel_features).failed == 0


def test_on_by_default_and_names(split) -> None:
    assert CoarseConfig().channel_features
    after = len(FEATURES) + len(ITEM_AGE_FEATURES)
    assert FeatureBuilder().fit(split).feature_names[after:][:len(CHANNEL_FEATURES)] == [*CHANNEL_FEATURES]
    assert "covisit_recent" not in FeatureBuilder(CoarseConfig(channel_features=False)).fit(split).feature_names
    assert fitted(split).feature_names == [*FEATURES, *ITEM_AGE_FEATURES, *CHANNEL_FEATURES, "rank_pop", "recall_pop",
                                           "src_pop"]


def test_covisitation_feature_by_hand(split) -> None:
    # window 1, backward 0.5: W[1,2] = 2 (u0, u1), W[0,2] = 1 (u2), W[0,1] = 1, W[1,0] = .5
    # history [0, 1], last 2 items: weight 1 for item 1, 1/2 for item 0
    f = columns(fitted(split), [0, 1], [2, 3, 4, 0])
    np.testing.assert_allclose(f["covisit_recent"], [2 + 0.5 * 1, 0, 0, 0.5])
    np.testing.assert_allclose(f["covisit_recent_rel"], [1, 0, 0, 0.5 / 2.5])


def test_covisitation_feature_of_the_train_builder_never_sees_the_label(split) -> None:
    # prefix (each user's last train item held out): u0 [0,1], u1 [1,2], u2 [0,2] -> W[1,2] = 1, W[0,2] = 1
    f = columns(fitted(split, training_prefix(split, 1)), [0, 1], [2])
    np.testing.assert_allclose(f["covisit_recent"], [1 + 0.5 * 1])


def test_item_model_feature_is_the_channel_score(split) -> None:
    w = ease([np.array([0, 1, 2]), np.array([1, 2, 3]), np.array([0, 2, 4])], 5, l2=500.0)
    expected = NeighbourChannel("m", w, 3).scores(np.array([0, 1]))[[2, 3, 4]]
    f = columns(fitted(split), [0, 1], [2, 3, 4])
    np.testing.assert_allclose(f["item_model_score"], expected, rtol=1e-6)
    assert expected[0] > 0  # item 2 follows 0 and 1 in the data: a positive EASE weight
    np.testing.assert_allclose(f["item_model_rel"], expected / expected.max(), rtol=1e-6)


def test_channel_ranks_and_cold_user(split) -> None:
    f = columns(fitted(split), [0, 1], [2, 3, 4], pop=[0.3, np.nan, 0.9])
    np.testing.assert_array_equal(f["rank_pop"], [1.0, np.nan, 0.0])
    cold = columns(fitted(split), [], [2, 3], pop=[0.3, 0.1])
    assert np.isnan(cold["covisit_recent"]).all() and np.isnan(cold["item_model_rel"]).all()
    np.testing.assert_array_equal(cold["rank_pop"], [0.0, 1.0])


def test_save_load_round_trip(split, tmp_path) -> None:
    fb = fitted(split)
    save_builder(fb, tmp_path)
    again = load_builder(tmp_path)
    a, b = columns(fb, [0, 1, 2], [3, 4], pop=[1, 2]), columns(again, [0, 1, 2], [3, 4], pop=[1, 2])
    assert list(a) == list(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def test_importance_table_covers_every_feature(trained) -> None:
    _, report = trained
    table = report["feature_importance_gain"]
    assert list(table) == sorted(table, key=lambda n: -table[n]["gain"])
    assert len(table) == report["n_features"]
    assert sum(v["share"] for v in table.values()) == pytest.approx(1.0, abs=1e-3)
    assert importance_table(["a", "b"], np.zeros(2)) == {"a": {"gain": 0.0, "share": 0.0},
                                                         "b": {"gain": 0.0, "share": 0.0}}
