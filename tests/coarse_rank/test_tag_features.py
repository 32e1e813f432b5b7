"""Tag features (CoarseConfig.tag_features): values by hand, persistence, training, the stage's subdir."""

from __future__ import annotations

import doctest

import numpy as np
import pandas as pd
import pytest

from coarse_rank import item_tags
from coarse_rank.config import CoarseConfig
from coarse_rank.feature_names import FEATURES, TAG_FEATURES
from coarse_rank.feature_store import load_builder, save_builder
from coarse_rank.features import FeatureBuilder
from coarse_rank.item_age import ITEM_AGE_FEATURES
from coarse_rank.item_tags import ItemTags
from coarse_rank.stage import CoarseStage
from coarse_rank.train import train_coarse
from recsys.config import StageSpec
from recsys.contract import Candidates, Request
from tests.coarse_rank.conftest import TOY_CONFIG
from tests.coarse_rank.test_features import ITEMS, RATINGS, SEQS, STAMPS, USERS, features
from tests.coarse_rank.toy import PopularityStage, split_from_sequences

# The default feature list as it was before tag features existed: it must not move.
DEFAULT_NAMES = [
    "recall", "recall_rank", "recall_gap", "item_log_pop", "item_recent_pop", "item_year", "item_audience",
    "item_mean_rating", "item_n_categories", "hist_len", "cat_affinity_max", "cat_affinity_mean", "follow_last",
    "follow_last_norm", "follow_recent_sum", "follow_recent_max", "precede_last", "user_age", "user_gender",
    "user_occupation", "age_item_lift", "gender_item_lift", "occupation_item_lift",
]
# item 2 is a fallback record (unknown tags); embeddings are 2-d by hand
EMBEDDINGS = np.array([[1, 0], [0, 1], [1, 0], [-1, 0], [0.6, 0.8]], dtype=np.float32)


def tags_frame(n: int = 5) -> pd.DataFrame:
    return pd.DataFrame({
        "item_idx": range(n), "fallback": [False, False, True, False, False][:n],
        "genres": [["Horror"], ["Horror", "Comedy"], [], ["Comedy"], ["Horror"]][:n],
        "themes": [["dark"], ["dark", "funny"], [], ["funny"], ["dark"]][:n],
        "risk_flags": [["violence"], [], [], ["violence", "drugs"], ["violence"]][:n],
    })


@pytest.fixture()
def split():
    return split_from_sequences(SEQS, ITEMS, USERS, STAMPS, RATINGS)


def tagged(split, **cfg) -> FeatureBuilder:
    config = CoarseConfig(tag_features=True, last_n=2, channel_features=False, **cfg)
    return FeatureBuilder(config).fit(split, score_columns=["recall_pop"], flag_columns=["src_pop"],
                                      tags=ItemTags.from_tags(tags_frame(), EMBEDDINGS, 5))


def test_item_tags_doctest():
    assert doctest.testmod(item_tags).failed == 0


def test_default_feature_list_is_unchanged(split):
    fb = FeatureBuilder(CoarseConfig(channel_features=False)).fit(split, score_columns=["recall_pop"])
    assert list(FEATURES) == DEFAULT_NAMES and fb.feature_names == [*DEFAULT_NAMES, *ITEM_AGE_FEATURES, "recall_pop"]


def test_tag_feature_names_sit_between_the_base_and_the_channel_columns(split):
    assert tagged(split).feature_names == [*DEFAULT_NAMES, *TAG_FEATURES, *ITEM_AGE_FEATURES, "recall_pop", "src_pop"]
    assert all(TAG_FEATURES.values())


def test_tag_feature_values_by_hand(split):
    # history [0, 2, 4]: item 2 is a fallback, so the known history is [0, 4]: Horror 1, Comedy 0,
    # dark 1, funny 0, mean risk flags 1. Last item 4 = (0.6, 0.8); last 2 = items 2, 4 -> mean (0.8, 0.4).
    f = features(tagged(split), history=[0, 2, 4], items=[0, 1, 3, 2])
    np.testing.assert_allclose(f["tag_genre_affinity_max"], [1, 1, 0, np.nan])  # all-Horror history: 1
    np.testing.assert_allclose(f["tag_genre_affinity_mean"], [1, 0.5, 0, np.nan])
    np.testing.assert_allclose(f["tag_theme_affinity_max"], [1, 1, 0, np.nan])
    np.testing.assert_allclose(f["tag_theme_affinity_mean"], [1, 0.5, 0, np.nan])
    np.testing.assert_allclose(f["tag_n_risk_flags"], [1, 0, 2, np.nan])  # fallback: unknown, not 0
    np.testing.assert_allclose(f["tag_risk_excess"], [0, -1, 1, np.nan])
    np.testing.assert_allclose(f["llm_cos_last"], [0.6, 0.8, -0.6, 0.6], rtol=1e-6)
    recent = np.array([0.8, 0.4]) / np.linalg.norm([0.8, 0.4])
    np.testing.assert_allclose(f["llm_cos_recent"], EMBEDDINGS[[0, 1, 3, 2]] @ recent, rtol=1e-6)


def test_unknown_history_and_no_history_read_nan(split):
    fb = tagged(split)
    only_fallback = features(fb, history=[2], items=[0, 1])
    for name in ("tag_genre_affinity_max", "tag_theme_affinity_mean", "tag_risk_excess"):
        assert np.isnan(only_fallback[name]).all(), name
    np.testing.assert_allclose(only_fallback["tag_n_risk_flags"], [1, 0])
    np.testing.assert_allclose(only_fallback["llm_cos_last"], [1, 0])  # the embedding of a fallback is known
    cold = features(fb, history=[], items=[0, 1])
    assert all(np.isnan(cold[name]).all() for name in TAG_FEATURES if name != "tag_n_risk_flags")


def test_save_load_round_trip_keeps_the_tag_features(split, tmp_path):
    fb = tagged(split)
    save_builder(fb, tmp_path)
    again = load_builder(tmp_path)
    req = Request(user_id="x", history=np.array([0, 2, 4]))
    cands = Candidates(items=np.array([1, 3, 2]), scores={"recall": np.array([3, 2, 1], np.float32)})
    np.testing.assert_array_equal(fb.transform(req, cands), again.transform(req, cands))
    assert again.feature_names == fb.feature_names and again.config.tag_features
    assert {p.name for p in tmp_path.iterdir()} == {"features.json", "features.npz"}  # self-contained


def test_bad_tag_inputs_raise_naming_the_counts(split):
    with pytest.raises(ValueError, match="tags cover 4 items.*catalog has 5"):
        ItemTags.from_tags(tags_frame(4), EMBEDDINGS[:4], 5)
    short = ItemTags.from_tags(tags_frame(4), EMBEDDINGS[:4], 4)
    with pytest.raises(ValueError, match="item tags cover 4 items, the catalog has 5"):
        FeatureBuilder(CoarseConfig(tag_features=True)).fit(split, tags=short)
    with pytest.raises(ValueError, match="embeddings have shape .*catalog has 5"):
        ItemTags.from_tags(tags_frame(), EMBEDDINGS[:3], 5)
    with pytest.raises(ValueError, match="tag_features is true but no item tags"):
        FeatureBuilder(CoarseConfig(tag_features=True)).fit(split)
    with pytest.raises(ValueError, match="tag_features is false"):
        FeatureBuilder(CoarseConfig()).fit(split, tags=ItemTags.from_tags(tags_frame(), EMBEDDINGS, 5))


def chain_tags(n_items: int) -> ItemTags:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({
        "item_idx": range(n_items), "fallback": [i % 7 == 3 for i in range(n_items)],
        "genres": [[f"g{i % 4}"] for i in range(n_items)], "themes": [[f"t{i % 2}"] for i in range(n_items)],
        "risk_flags": [["violence"] if i % 5 == 0 else [] for i in range(n_items)],
    })
    return ItemTags.from_tags(frame, rng.normal(size=(n_items, 8)).astype(np.float32), n_items)


def test_a_tag_feature_model_loads_from_its_subdir_and_scores(chain, tmp_path):
    config = TOY_CONFIG.model_copy(update={"tag_features": True, "n_estimators": 20, "max_train_users": 40})
    with pytest.raises(ValueError, match="no item tags"):  # fails before the candidate pass
        train_coarse(chain, PopularityStage(chain), tmp_path / "coarse_tags", config, progress=False)
    report = train_coarse(chain, PopularityStage(chain), tmp_path / "coarse_tags", config, seed=7,
                          progress=False, tags=chain_tags(chain.n_items))
    assert report["n_features"] == len(DEFAULT_NAMES) + len(TAG_FEATURES) + len(ITEM_AGE_FEATURES) + 2
    spec = StageSpec(name="coarse", kind="coarse", depth=5, params={"subdir": "coarse_tags"})
    stage = CoarseStage(spec, CoarseConfig())
    stage.load(tmp_path)
    assert not (tmp_path / "coarse").exists()
    req = Request(user_id="u", history=chain.train_sequences[0])
    cands = PopularityStage(chain).run(req, Candidates.empty())
    out = stage.run(req, cands)
    # every candidate scored and sorted; the pipeline, not the stage, cuts to the depth
    assert len(out) == len(cands) and np.isfinite(out.scores["coarse"]).all()
    assert (np.diff(out.scores["coarse"]) <= 0).all()
    with pytest.raises(FileNotFoundError, match="coarse/meta.json"):
        CoarseStage(StageSpec(name="coarse", kind="coarse"), CoarseConfig()).load(tmp_path)


@pytest.mark.parametrize("params", [{"subdir": ""}, {"subdir": "../x"}, {"subdir": 3}, {"dir": "coarse"}])
def test_bad_stage_params_are_rejected(params):
    with pytest.raises(ValueError, match="params"):
        CoarseStage(StageSpec(name="coarse", kind="coarse", params=params), CoarseConfig())
