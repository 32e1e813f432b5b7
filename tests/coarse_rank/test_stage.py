"""CoarseStage: the Stage contract, load round trip, depth cut, batch path."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from cascade.registry import build_stage
from cascade.settings import Settings
from coarse_rank.config import CoarseConfig
from coarse_rank.dataset import build_groups
from coarse_rank.features import FeatureBuilder
from coarse_rank.stage import CoarseStage
from coarse_rank.train import train_coarse
from recsys.config import StageSpec
from recsys.contract import Candidates, Request, Stage, StageError
from tests.coarse_rank.conftest import TOY_CONFIG
from tests.coarse_rank.toy import PopularityStage


def loaded(root, depth=None, new_items="auto") -> CoarseStage:
    stage = build_stage(StageSpec(name="coarse", kind="coarse", depth=depth),
                        Settings.build({"coarse": {"new_items": new_items}}))
    assert isinstance(stage, CoarseStage) and isinstance(stage, Stage)
    stage.load(root)
    return stage


@pytest.fixture(scope="module")
def valid_groups(chain):
    return build_groups(chain, PopularityStage(chain), "valid", users=range(20), progress=False)


def test_loaded_scores_equal_a_freshly_fitted_builder_with_the_saved_boosters(chain, trained, valid_groups):
    import lightgbm as lgb

    root, report = trained
    stage = loaded(root)
    fresh = FeatureBuilder(TOY_CONFIG).fit(chain, score_columns=["recall_popularity"], flag_columns=["src_popularity"])
    files = ["model.txt", "model-1.txt", "model-2.txt"]  # the default ensemble of three fits
    assert report["ensemble"]["files"] == files and report["ensemble"]["seeds"] == [7, 8, 9]
    boosters = [lgb.Booster(model_file=str(root / "coarse" / name)) for name in files]
    for req, cands in zip(valid_groups.requests[:5], valid_groups.candidates[:5], strict=True):
        out = stage.run(req, cands)
        x = fresh.transform(req, cands)
        expected = np.mean([b.predict(x) for b in boosters], axis=0).astype(np.float32)
        order = np.argsort(-expected, kind="stable")
        np.testing.assert_array_equal(out.items, cands.items[order])
        np.testing.assert_array_equal(out.scores["coarse"], expected[order])
        assert "item_model" not in out.scores  # trained without channel features: no item model to pass on
    texts = b"".join((root / "coarse" / name).read_bytes() for name in files)
    assert stage.version() == hashlib.sha256(texts).hexdigest()[:12]


def test_run_reorders_without_adding_or_dropping_items(trained, valid_groups):
    root, _ = trained
    full, cut = loaded(root), loaded(root, depth=5)
    req, cands = valid_groups.requests[0], valid_groups.candidates[0]
    out = full.run(req, cands)
    assert sorted(out.items.tolist()) == sorted(cands.items.tolist()) and out.order_by == "coarse"
    assert (np.diff(out.scores["coarse"]) <= 0).all()
    recall_of = dict(zip(cands.items.tolist(), cands.scores["recall"].tolist(), strict=True))
    assert out.scores["recall"].tolist() == [recall_of[i] for i in out.items.tolist()]  # columns stay aligned
    assert out.flags["src_popularity"].all() and "coarse" not in cands.scores  # input not mutated
    # the depth is the pipeline's cut, not the stage's: what lies past it is the backfill's first source
    np.testing.assert_array_equal(cut.run(req, cands).items, out.items)


def test_score_many_matches_run(trained, valid_groups):
    stage = loaded(trained[0], depth=10)
    batch = stage.score_many(valid_groups.requests, valid_groups.candidates)
    for req, cands, got in zip(valid_groups.requests, valid_groups.candidates, batch, strict=True):
        one = stage.run(req, cands)
        np.testing.assert_array_equal(got.items, one.items)
        np.testing.assert_allclose(got.scores["coarse"], one.scores["coarse"], rtol=1e-6)


def test_the_item_model_feature_goes_out_as_its_own_column(chain, tmp_path, valid_groups):
    config = TOY_CONFIG.model_copy(update={"channel_features": True})
    train_coarse(chain, PopularityStage(chain), tmp_path / "coarse", config, seed=7, progress=False)
    stage = loaded(tmp_path)
    builder = FeatureBuilder(config).fit(chain, score_columns=["recall_popularity"], flag_columns=["src_popularity"])
    at = builder.feature_names.index("item_model_score")
    for req, cands in zip(valid_groups.requests[:5], valid_groups.candidates[:5], strict=True):
        out = stage.run(req, cands)
        by_item = dict(zip(cands.items.tolist(), builder.transform(req, cands)[:, at].tolist(), strict=True))
        np.testing.assert_array_equal(out.scores["item_model"], [by_item[i] for i in out.items.tolist()])
        assert out.order_by == "coarse" and (np.diff(out.scores["coarse"]) <= 0).all()


def test_with_fits_serves_the_first_fits_alone(chain, trained, valid_groups):
    import lightgbm as lgb

    root, _ = trained
    stage = loaded(root)
    one = stage.with_fits(1)
    assert stage.fits == 3 and one.fits == 1
    first = lgb.Booster(model_file=str(root / "coarse" / "model.txt"))
    fresh = FeatureBuilder(TOY_CONFIG).fit(chain, score_columns=["recall_popularity"], flag_columns=["src_popularity"])
    req, cands = valid_groups.requests[0], valid_groups.candidates[0]
    expected = first.predict(fresh.transform(req, cands)).astype(np.float32)
    np.testing.assert_array_equal(one.run(req, cands).scores["coarse"], np.sort(expected)[::-1])
    with pytest.raises(ValueError, match="0 of 3"):
        stage.with_fits(0)


def test_empty_candidates_and_cold_users(trained):
    stage = loaded(trained[0], depth=5)
    empty = stage.run(Request(user_id="new"), Candidates.empty())
    assert len(empty) == 0 and "coarse" in empty.scores
    cold = stage.run(Request(user_id="new"), Candidates(items=np.array([3, 1, 2])))  # no history, no recall
    assert sorted(cold.items.tolist()) == [1, 2, 3] and np.isfinite(cold.scores["coarse"]).all()


def test_unloaded_and_missing_artifacts(tmp_path):
    stage = CoarseStage(StageSpec(name="coarse", kind="coarse"), CoarseConfig())
    assert stage.version() == "unloaded" and stage.reads == ("recall",) and stage.writes == ("coarse", "item_model")
    with pytest.raises(StageError, match="load"):
        stage.run(Request(user_id="x"), Candidates(items=np.array([1])))
    with pytest.raises(FileNotFoundError, match="coarse/meta.json"):
        stage.load(tmp_path)


def test_an_item_without_interactions_keeps_its_recall_place(trained, valid_groups):
    """A new item (none of its interactions in the fitted tables, or past the fitted catalog) is put
    where recall ranked it; the known items keep the model's order; with new_items='model' nothing
    moves, and 'auto' serves what training chose (the toy's valid groups hold no new item: the model)."""
    stage, as_model = loaded(trained[0], new_items="recall_place"), loaded(trained[0], new_items="model")
    req, cands = valid_groups.requests[0], valid_groups.candidates[0]
    recall_order = cands.sorted_by("recall").items
    new = int(recall_order[2])  # recall's third candidate, whatever the model thinks of it
    for s in (stage, as_model):
        s._known = s._known.copy()
        s._known[new] = False
    model_order = as_model.run(req, cands).items
    out = stage.run(req, cands)
    assert out.items[2] == new and model_order[2] != new
    np.testing.assert_array_equal(out.items[out.items != new], model_order[model_order != new])
    auto = loaded(trained[0])
    assert auto._new_items == "model"
    meta = json.loads((trained[0] / "coarse" / "meta.json").read_text())
    assert meta["report"]["new_items"] == {"chosen": "model",
                                           "why": "no valid group holds an item without interactions"}
    # an item id past the fitted tables (added to the catalog after training) counts as new
    stage._known = stage._known[:new]
    assert stage.run(req, cands).items[2] == new
