"""Training: learns a predictable label, keeps label-less groups out, deterministic, test-blind."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from coarse_rank.config import CoarseConfig
from coarse_rank.dataset import QueryGroups, build_groups
from coarse_rank.features import FeatureBuilder
from coarse_rank.item_age import ItemAge
from coarse_rank.stage import CoarseStage
from coarse_rank.train import cold_item_variants, cold_items_for_training, train_coarse
from recsys.config import StageSpec
from recsys.contract import Candidates, Request
from tests.coarse_rank.conftest import TOY_CONFIG
from tests.coarse_rank.toy import PopularityStage


def test_ranker_puts_the_next_item_first_more_often_than_recall(chain, trained):
    root, report = trained
    assert report["valid_ndcg@10_coarse"] > report["valid_ndcg@10_recall"] + 0.3
    stage = CoarseStage(StageSpec(name="coarse", kind="coarse"), CoarseConfig())
    stage.load(root)
    groups = build_groups(chain, PopularityStage(chain), "valid", progress=False)
    ranked = stage.score_many(groups.requests, groups.candidates)
    coarse_top1 = np.mean([r.items[0] == t for r, t in zip(ranked, groups.labels, strict=True)])
    recall_top1 = np.mean([c.items[0] == t for c, t in zip(groups.candidates, groups.labels, strict=True)])
    assert recall_top1 < 0.2 and coarse_top1 > 0.5, (recall_top1, coarse_top1)


def test_report_and_artifacts(trained):
    root, report = trained
    assert {p.name for p in (root / "coarse").iterdir()} == {"model.txt", "features.npz", "features.json", "meta.json"}
    assert report["n_train_queries"] == report["n_train_groups"] == 160  # every unseen item is a candidate
    assert report["n_valid_groups"] == 160 and report["train_positive_share"] == 1.0
    assert 1 <= report["best_iteration"] <= TOY_CONFIG.n_estimators
    assert next(iter(report["feature_importance_top10"])).startswith("follow_last")
    meta = json.loads((root / "coarse" / "meta.json").read_text())
    assert meta["seed"] == 7 and meta["report"] == report and "recall_popularity" in meta["feature_names"]


def test_groups_without_the_label_stay_out_of_training(chain, tmp_path):
    shallow = PopularityStage(chain, depth=8)
    report = train_coarse(chain, shallow, tmp_path, TOY_CONFIG, seed=7, progress=False)
    seqs = chain.train_sequences
    hits = sum(s[-1] in shallow.run(Request(user_id="x", history=s[:-1]), Candidates.empty()).items for s in seqs)
    assert report["n_train_queries"] == 160 and report["n_train_groups"] == hits < 160
    assert report["train_positive_share"] == pytest.approx(hits / 160)
    assert report["n_train_rows"] == 8 * hits


def test_train_stage_recalls_the_train_groups_and_the_candidate_stage_the_valid_ones(chain, tmp_path):
    shallow = PopularityStage(chain, depth=8)
    report = train_coarse(chain, PopularityStage(chain), tmp_path, TOY_CONFIG, seed=7, progress=False,
                          train_stage=shallow)
    hits = sum(s[-1] in shallow.run(Request(user_id="x", history=s[:-1]), Candidates.empty()).items
               for s in chain.train_sequences)
    assert report["n_train_groups"] == hits < 160 and report["n_train_rows"] == 8 * hits
    assert report["n_valid_groups"] == 160  # every unseen item is a valid candidate: the full stage


def test_no_candidate_holding_a_label_is_an_error(chain, tmp_path):
    with pytest.raises(ValueError, match="none of the 160 train groups"):
        train_coarse(chain, PopularityStage(chain, depth=0), tmp_path, TOY_CONFIG, progress=False)


def test_training_is_deterministic_and_never_reads_the_test_items(chain, trained, tmp_path):
    root, report = trained
    scrambled = dataclasses.replace(chain, test=np.full_like(chain.test, -999), _seqs=None)
    again = train_coarse(scrambled, PopularityStage(scrambled), tmp_path, TOY_CONFIG, seed=7, progress=False)
    assert (tmp_path / "model.txt").read_bytes() == (root / "coarse" / "model.txt").read_bytes()
    assert {k: v for k, v in again.items() if k != "seconds"} == {k: v for k, v in report.items() if k != "seconds"}


def test_a_fixed_dropout_fits_once(chain, tmp_path):
    report = train_coarse(chain, PopularityStage(chain), tmp_path, TOY_CONFIG.model_copy(update={"cold_item_dropout": 0.1}),
                          seed=7, progress=False)
    assert report["cold_item_dropout"] == {"valid_ndcg": {"0.1": pytest.approx(report["valid_ndcg@10_coarse"], abs=1e-5)},
                                           "chosen": 0.1}
    assert report["cold_item_training"]["dropout"] == 0.1


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
