"""LLM-embedding features (CoarseConfig.llm_embedding_features): values against numpy, persistence,
train/serve equality, the stage serving a model trained with them."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

from coarse_rank import llm_features
from coarse_rank.config import CoarseConfig
from coarse_rank.feature_store import load_builder, save_builder
from coarse_rank.features import FeatureBuilder
from coarse_rank.item_age import ITEM_AGE_FEATURES
from coarse_rank.llm_features import LLM_EMBEDDING_FEATURES, ItemEmbeddings
from coarse_rank.stage import CoarseStage
from coarse_rank.train import train_coarse
from recsys.config import StageSpec
from recsys.contract import Candidates, Request
from tests.coarse_rank.conftest import TOY_CONFIG
from tests.coarse_rank.test_features import ITEMS, RATINGS, SEQS, STAMPS, USERS, features
from tests.coarse_rank.test_tag_features import DEFAULT_NAMES
from tests.coarse_rank.toy import PopularityStage, split_from_sequences

VECTORS = np.random.default_rng(3).normal(size=(5, 6)).astype(np.float32)


@pytest.fixture()
def split():
    return split_from_sequences(SEQS, ITEMS, USERS, STAMPS, RATINGS)


def embedded(split, last_n: int = 2) -> FeatureBuilder:
    config = CoarseConfig(llm_embedding_features=True, last_n=last_n, channel_features=False)
    return FeatureBuilder(config).fit(split, score_columns=["recall_pop"], flag_columns=["src_pop"],
                                      llm=ItemEmbeddings.from_vectors(VECTORS, 5))


def test_llm_features_doctest():
    assert doctest.testmod(llm_features).failed == 0


def test_auto_by_default_and_the_names_sit_between_the_base_and_the_channel_columns(split):
    assert CoarseConfig().llm_embedding_features == "auto"
    assert not set(LLM_EMBEDDING_FEATURES) & set(FeatureBuilder(CoarseConfig()).fit(split).feature_names)
    assert embedded(split).feature_names == [*DEFAULT_NAMES, *LLM_EMBEDDING_FEATURES, *ITEM_AGE_FEATURES, "recall_pop",
                                               "src_pop"]
    assert all(LLM_EMBEDDING_FEATURES.values())


@pytest.mark.parametrize("last_n", [1, 2, 5])
def test_values_match_a_direct_numpy_computation(split, last_n):
    history, items = [4, 0, 2, 3], [1, 3, 0, 2, 4]
    f = features(embedded(split, last_n), history=history, items=items)
    unit = VECTORS / np.linalg.norm(VECTORS, axis=1, keepdims=True)
    recent = unit[history[-last_n:]]
    mean = recent.mean(axis=0)
    np.testing.assert_allclose(f["llm_emb_cos_mean"], unit[items] @ (mean / np.linalg.norm(mean)), rtol=1e-5)
    np.testing.assert_allclose(f["llm_emb_cos_max"], (unit[items] @ recent.T).max(axis=1), rtol=1e-5)


def test_no_history_reads_nan_and_the_other_features_do_not_move(split):
    with_llm, without = embedded(split), FeatureBuilder(CoarseConfig(last_n=2, channel_features=False)).fit(
        split, score_columns=["recall_pop"], flag_columns=["src_pop"])
    cold = features(with_llm, history=[], items=[0, 1])
    assert all(np.isnan(cold[name]).all() for name in LLM_EMBEDDING_FEATURES)
    a, b = features(with_llm, history=[0, 2], items=[1, 3]), features(without, history=[0, 2], items=[1, 3])
    for name in b:
        np.testing.assert_array_equal(a[name], b[name])


def test_saved_and_loaded_builder_gives_the_same_matrix(split, tmp_path):
    fb = embedded(split)
    save_builder(fb, tmp_path)
    again = load_builder(tmp_path)
    req = Request(user_id="x", history=np.array([0, 2, 4]))
    cands = Candidates(items=np.array([1, 3, 2]), scores={"recall": np.array([3, 2, 1], np.float32)})
    np.testing.assert_array_equal(fb.transform(req, cands), again.transform(req, cands))
    assert again.config.llm_embedding_features and again.feature_names == fb.feature_names


def test_bad_inputs_raise_naming_what_is_wrong(split):
    with pytest.raises(ValueError, match="shape .*catalog has 5"):
        ItemEmbeddings.from_vectors(VECTORS[:4], 5)
    with pytest.raises(ValueError, match="cover 4 items, the catalog has 5"):
        FeatureBuilder(CoarseConfig(llm_embedding_features=True)).fit(
            split, llm=ItemEmbeddings.from_vectors(VECTORS[:4], 4))
    with pytest.raises(ValueError, match="llm_embedding_features is true but no LLM item embeddings"):
        FeatureBuilder(CoarseConfig(llm_embedding_features=True)).fit(split)
    with pytest.raises(ValueError, match="llm_embedding_features is false"):
        FeatureBuilder(CoarseConfig(llm_embedding_features=False)).fit(split, llm=ItemEmbeddings.from_vectors(VECTORS, 5))
    with pytest.raises(ValueError, match="'auto': fit it with true or false"):  # fit_coarse resolves auto
        FeatureBuilder(CoarseConfig()).fit(split, llm=ItemEmbeddings.from_vectors(VECTORS, 5))


def test_a_model_trained_with_them_serves_the_features_it_trained_on(chain, tmp_path):
    config = TOY_CONFIG.model_copy(update={"llm_embedding_features": True, "n_estimators": 20,
                                           "max_train_users": 40})
    vectors = np.random.default_rng(0).normal(size=(chain.n_items, 8)).astype(np.float32)
    with pytest.raises(ValueError, match="no LLM item embeddings"):  # fails before the candidate pass
        train_coarse(chain, PopularityStage(chain), tmp_path / "coarse", config, progress=False)
    report = train_coarse(chain, PopularityStage(chain), tmp_path / "coarse", config, seed=7, progress=False,
                          llm=ItemEmbeddings.from_vectors(vectors, chain.n_items))
    assert report["n_features"] == len(DEFAULT_NAMES) + len(LLM_EMBEDDING_FEATURES) + len(ITEM_AGE_FEATURES) + 2
    stage = CoarseStage(StageSpec(name="coarse", kind="coarse", depth=5), CoarseConfig())
    stage.load(tmp_path)
    req = Request(user_id="u", history=chain.train_sequences[0])
    cands = PopularityStage(chain).run(req, Candidates.empty())
    served = stage.run(req, cands)
    assert len(served) == len(cands) and np.isfinite(served.scores["coarse"]).all()
    # serve time reads the embeddings saved with the builder: the same columns training computed
    trained = FeatureBuilder(config).fit(chain, score_columns=stage._builder.score_columns,
                                         flag_columns=stage._builder.flag_columns,
                                         llm=ItemEmbeddings.from_vectors(vectors, chain.n_items))
    np.testing.assert_array_equal(stage._builder.transform(req, cands), trained.transform(req, cands))
