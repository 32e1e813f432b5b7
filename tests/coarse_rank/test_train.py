"""Training: learns a predictable label, keeps label-less groups out, deterministic, test-blind."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from coarse_rank.config import CoarseConfig
from coarse_rank.dataset import build_groups
from coarse_rank.stage import CoarseStage
from coarse_rank.train import train_coarse
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
    assert {p.name for p in (root / "coarse").iterdir()} == {"model.txt", "model-1.txt", "model-2.txt", "features.npz",
                                                             "features.json", "meta.json"}
    ensemble = report["ensemble"]
    assert ensemble["fits"] == 3 and ensemble["seeds"] == [7, 8, 9] and len(ensemble["valid_ndcg_per_fit"]) == 3
    assert ensemble["best_iterations"][0] == report["best_iteration"]
    assert report["n_train_queries"] == report["n_train_groups"] == 160  # every unseen item is a candidate
    assert report["n_valid_groups"] == 160 and report["train_positive_share"] == 1.0
    assert 1 <= report["best_iteration"] <= TOY_CONFIG.n_estimators
    assert next(iter(report["feature_importance_top10"])).startswith("follow_last")
    meta = json.loads((root / "coarse" / "meta.json").read_text())
    assert meta["seed"] == 7 and meta["report"] == report and "recall_popularity" in meta["feature_names"]


def test_one_fit_leaves_no_member_of_an_earlier_ensemble_behind(chain, tmp_path):
    train_coarse(chain, PopularityStage(chain), tmp_path, TOY_CONFIG, seed=7, progress=False)
    assert (tmp_path / "model-2.txt").exists()
    single = TOY_CONFIG.model_copy(update={"ensemble": 1})
    report = train_coarse(chain, PopularityStage(chain), tmp_path, single, seed=7, progress=False)
    assert report["ensemble"]["files"] == ["model.txt"] and not list(tmp_path.glob("model-*.txt"))
    stage = CoarseStage(StageSpec(name="coarse", kind="coarse", params={"subdir": tmp_path.name}), CoarseConfig())
    stage.load(tmp_path.parent)
    assert stage.fits == 1


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
    first = report["ensemble"]["valid_ndcg_per_fit"][0]  # the fit the choice was made with
    assert report["cold_item_dropout"] == {"valid_ndcg": {"0.1": pytest.approx(first, abs=1e-5)}, "chosen": 0.1}
    assert report["cold_item_training"]["dropout"] == 0.1

