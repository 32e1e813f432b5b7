"""The LLM-embedding measurement (jobs.tagging.embedding_eval) on the tiny trained cascade and the tiny LLM:
one recall fit shared by every seed and variant, the channel and the features each alone, a rerun that
trains nothing."""

from __future__ import annotations

import doctest
import json
import shutil

import numpy as np
import pytest

from jobs.tagging import embedding_eval
from jobs.tagging.embed import EmbedSettings
from jobs.tagging.embedding_eval import SHARED, embedding_report, merge_reports, seed_dir
from jobs.tagging.hidden_states import HiddenSettings, embed_catalog
from offline.split import Split
from tests.jobs.tagging.factories import tiny_model_dir
from tests.trained_cascade import trained_with


def test_embedding_eval_doctests():
    assert doctest.testmod(embedding_eval).failed == 0


def test_one_recall_fit_serves_every_seed_and_variant(tiny_cascade, tmp_path):
    src, _ = tiny_cascade
    root = tmp_path / "art"
    shutil.copytree(src, root)
    split = Split.load(root / "split")
    embed_catalog(split, str(tiny_model_dir()), root, split.items["title"].astype(str).tolist(),
                  HiddenSettings(threads=1), embed=EmbedSettings(epochs=2, dim=16), progress=False)
    recall_run = json.loads((root / "recall" / "stage.json").read_text())["run_id"]
    settings = trained_with()
    report = embedding_report(settings, root, split, seeds=(5, 6), n_boot=50, progress=False)
    assert json.loads((root / "recall" / "stage.json").read_text())["run_id"] == recall_run  # not retrained
    assert all(r["reused"] for r in report["recall_fit"].values())
    for seed in (5, 6):
        for features in (False, True):
            d = seed_dir(root, seed, features)
            assert all((d / name).is_symlink() and (d / name).resolve() == (root / name).resolve() for name in SHARED)
        row = report["per_seed"][seed]
        base, channel, feats = (row["variants"][v] for v in ("base", "llm_channel", "llm_features"))
        # the channel changes recall's candidates, never coarse's model; the features change coarse, never recall
        assert feats["recall_ndcg@10"] == base["recall_ndcg@10"] and feats["candidates_found"] == base["candidates_found"]
        assert not row["coarse_training"]["base"]["reused"] and not row["coarse_training"]["features"]["reused"]
        all_users = row["vs_base"]["llm_features"]["all"]
        assert all_users["users"] == report["slices"]["all"]
        assert np.isclose(all_users["coarse_ndcg@10"]["mean"], feats["coarse_ndcg@10"] - base["coarse_ndcg@10"],
                          atol=1e-4)
        assert channel["stage_ms"]["recall"]["mean"] > 0
    features_meta = json.loads((seed_dir(root, 5, True) / "coarse" / "features.json").read_text())
    assert "llm_emb_cos_mean" in features_meta["feature_names"]
    summary = report["summary"]["variants"]["base"]["coarse_ndcg@10"]
    assert len(summary["per_seed"]) == 2 and summary["sd"] >= 0
    row = report["table"]["llm_features"]
    deltas = [report["per_seed"][s]["vs_base"]["llm_features"]["all"]["coarse_ndcg@10"]["mean"] for s in (5, 6)]
    assert np.isclose(row["delta_ndcg@10"], np.mean(deltas), atol=1e-5) and len(row["ci95_seed_5"]) == 2
    assert "delta_ndcg@10" not in report["table"]["base"] and report["table"]["base"]["coarse_ms"] > 0
    again = embedding_report(settings, root, split, seeds=(5,), n_boot=50, progress=False)
    assert again["per_seed"][5]["coarse_training"]["features"]["reused"]
    def metrics(row: dict) -> dict:
        return {v: {k: x for k, x in m.items() if k != "stage_ms"} for v, m in row["variants"].items()}

    assert metrics(again["per_seed"][5]) == metrics(report["per_seed"][5])  # same models, same figures
    # a run per seed, joined: the figures of one run over both seeds
    merged = merge_reports(again, [{**report, "per_seed": {"6": report["per_seed"][6]}}])
    assert merged["seeds"] == [5, 6] and merged["summary"] == report["summary"]
    with pytest.raises(ValueError, match="seed 5 is in more than one report"):
        merge_reports(again, [report])
    with pytest.raises(ValueError, match="an included report has llm_share 0.5"):
        merge_reports(again, [{**report, "llm_share": 0.5}])
    assert report["embedding"]["items"] == split.n_items and report["embedding"]["projection"]["dim"] == 16
