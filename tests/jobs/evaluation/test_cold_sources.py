"""The cold-item slice per item-side source: variants, the cold tag holdout, one real run on synthetic data."""

import json
from pathlib import Path

import numpy as np
import pytest

from cascade.registry import build_pipeline
from cascade.settings import Settings
from jobs.evaluation.cold_items import prepare_cold
from jobs.evaluation.cold_sources import (
    RERANK_BUDGET_MS,
    VARIANTS,
    cold_source_report,
    cold_tag_holdout,
    variant_pipeline,
    with_llm_stage,
)
from jobs.prepare import prepare
from recsys.contract import Candidates
from tests.jobs.test_train import TINY
from tests.llm_rerank.factories import save_tiny_llm


def test_each_variant_switches_its_source_and_nothing_else() -> None:
    settings = Settings.build(TINY)
    for name, (text, swaps) in VARIANTS.items():
        chosen = variant_pipeline(settings, name)
        kinds = {s.name: s for s in chosen.pipeline.stages}
        assert chosen.recall.use_text is text
        assert (kinds["recall"].kind == "recall_llm") is ("llm_channel" in swaps)
        assert (kinds["coarse"].params.get("subdir") == "coarse_tags") is ("tag_features" in swaps)
        assert kinds["llm"].enabled is ("llm_rerank" in swaps)
    with pytest.raises(ValueError, match="unknown cold-source variant 'bogus'"):
        variant_pipeline(settings, "bogus")


def test_new_items_calibrate_no_tag_threshold() -> None:
    held = cold_tag_holdout(100, np.array([3, 97]), seed=1)
    assert {3, 97} <= set(held.tolist()) and len(held) >= 50 and np.all(np.diff(held) > 0)


@pytest.mark.slow
def test_llm_sources_are_rebuilt_on_the_cold_split_and_each_variant_measured(tmp_path: Path) -> None:
    art = tmp_path / "synthetic"
    split = prepare(None, art, n_users=60, n_items=120, seed=3)
    model = save_tiny_llm(tmp_path / "tiny-llm")
    settings = Settings.build({**TINY, "llm": {"model": str(model)}})
    report = cold_source_report(settings, art, split, variants=("none", "llm_tags", "llm_embedding"), n_boot=50,
                                progress=False)
    cold_dir, cold = prepare_cold(art, split, 0.1)
    new = cold.unseen_items
    held = json.loads((cold_dir / "tags" / "holdout.json").read_text())["items"]
    assert set(new.tolist()) <= set(held)  # no new item's labels calibrate the tag thresholds
    assert report["llm_sources"]["tagging"]["schema_valid_rate"] == 1.0
    assert report["llm_sources"]["embedding"]["pairs"] > 0 and report["new_items"] == len(new) > 0
    no_text = art / "cold-items-no-text" / "cold-items"
    assert (no_text / "recall").exists() and (no_text / "coarse_tags").exists() and (no_text / "tags" / "embed").exists()
    knowledge = {v: row["item_side_knowledge"] for v, row in report["variants"].items()}
    assert knowledge == {"none": {"text": False, "llm_tags": False, "llm_embedding": False},
                         "llm_tags": {"text": False, "llm_tags": True, "llm_embedding": False},
                         "llm_embedding": {"text": False, "llm_tags": False, "llm_embedding": True}}
    deltas = report["vs_base"]
    assert set(deltas) == {"llm_tags_vs_none", "llm_embedding_vs_none"}
    for rows in deltas.values():
        assert {"recall", "coarse", "candidates:recall"} <= set(rows["cold_item"])
        assert all(r["ci95"][0] <= r["mean"] <= r["ci95"][1] for r in rows["cold_item"].values())
    for row in report["variants"].values():
        assert row["slices"]["cold_item"]["users"] == int(np.isin(split.test, new).sum())
        assert {"recall", "coarse"} <= set(row["slices"]["cold_item"]["stages"])
    # the LLM-embedding variant's recall really merges the channel over the cold split's embeddings
    recall = {spec.name: stage for spec, stage in build_pipeline(variant_pipeline(settings, "llm_embedding"),
                                                                  no_text).stages}["recall"]
    user = int(np.flatnonzero(np.isin(split.test, new))[0])
    got = recall.run(cold.request(user, cold.history(user, "test")), Candidates.empty())
    assert got.flags["src_llm_embed"].any()
    again = cold_source_report(settings, art, split, variants=("none",), n_boot=50, progress=False)
    assert again["variants"]["none"]["slices"] == report["variants"]["none"]["slices"]  # reused, not retrained


def test_the_llm_stage_is_added_after_coarse_when_the_pipeline_has_none() -> None:
    settings = Settings.build(TINY)
    without = settings.pipeline.model_copy(update={"stages": [s for s in settings.pipeline.stages if s.kind != "llm"]})
    chosen = with_llm_stage(settings.model_copy(update={"pipeline": without}))
    names = [s.name for s in chosen.pipeline.stages]
    assert names[names.index("coarse") + 1] == "llm"
    llm = chosen.pipeline.stages[names.index("llm")]
    assert llm.enabled and llm.depth == settings.llm.candidates and llm.budget_ms == RERANK_BUDGET_MS
    no_coarse = settings.pipeline.model_copy(update={"stages": [s for s in without.stages if s.kind != "coarse"]})
    with pytest.raises(ValueError, match="needs a coarse stage"):
        with_llm_stage(settings.model_copy(update={"pipeline": no_coarse}))


def test_a_variant_the_pipeline_cannot_run_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    settings = Settings.build(TINY)
    no_coarse = settings.pipeline.model_copy(update={"stages": [s for s in settings.pipeline.stages
                                                                if s.kind not in ("coarse", "llm")]})
    art = tmp_path / "synthetic"
    split = prepare(None, art, n_users=30, n_items=60, seed=3)
    with pytest.raises(ValueError, match="needs a coarse stage"):
        cold_source_report(settings.model_copy(update={"pipeline": no_coarse}), art, split,
                           variants=("text", "text+llm_rerank"), progress=False)
    assert not (art / "cold-items").exists()


@pytest.mark.slow
def test_the_llm_reranker_is_measured_on_every_cold_user_and_a_warm_sample(tmp_path: Path) -> None:
    art = tmp_path / "synthetic"
    split = prepare(None, art, n_users=60, n_items=120, seed=3)
    model = save_tiny_llm(tmp_path / "tiny-llm")
    settings = Settings.build({**TINY, "llm": {"model": str(model), "candidates": 5}})
    report = cold_source_report(settings, art, split, variants=("text", "text+llm_rerank"), n_boot=50,
                                progress=False, rerank_users=10)
    assert "llm_sources" not in report  # the re-ranker needs no tags or embeddings
    row = report["variants"]["text+llm_rerank"]
    _, cold = prepare_cold(art, split, 0.1)
    n_cold = int(np.isin(cold.test, cold.unseen_items).sum())
    assert n_cold > 0
    assert row["slices"]["cold_item"]["users"] == n_cold == report["variants"]["text"]["slices"]["cold_item"]["users"]
    assert row["slices"]["warm_item"]["users"] == row["warm_item_sample"]["users"] == 10
    assert row["measured_users"] == n_cold + 10 and row["stage_status"]["llm"] == {"ok": n_cold + 10}
    assert row["llm"]["zero_shot"] and not row["llm"]["adapted_on_cold_split"]
    assert row["gate"]["source"].startswith("fit_gate on 10 sampled valid users")
    assert {"llm", "final"} <= set(row["slices"]["cold_item"]["stages"])
    assert "llm_vs_coarse" in row["slices"]["cold_item"]["deltas"]
    # the same cold users as the text variant: paired against it; the warm sample is not the same users
    paired = report["vs_base"]["text+llm_rerank_vs_text"]
    assert "final" in paired["cold_item"] and "final" not in paired.get("warm_item", {})
    # recall and coarse are the text variant's own stages, so on the same users they agree exactly
    assert paired["cold_item"]["coarse"] == {"mean": 0.0, "ci95": [0.0, 0.0]}
