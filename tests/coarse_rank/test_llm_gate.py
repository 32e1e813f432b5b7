"""coarse.llm_embedding_features auto: the LLM columns are served only where they lift on valid, and the
served model, either way, is the one a fixed setting trains and loads back scoring as trained."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from coarse_rank.config import CoarseConfig
from coarse_rank.dataset import build_groups
from coarse_rank.features import FeatureBuilder
from coarse_rank.llm_features import LLM_EMBEDDING_FEATURES, ItemEmbeddings
from coarse_rank.llm_gate import NO_EMBEDDINGS, fixed_choice, without_llm
from coarse_rank.stage import CoarseStage
from coarse_rank.train import train_coarse
from offline.metrics import per_user_metrics
from offline.split import Split
from recsys.config import StageSpec
from recsys.contract import Candidates, Request
from tests.coarse_rank.conftest import TOY_CONFIG
from tests.coarse_rank.toy import PopularityStage, split_from_sequences

N_CLUSTERS, PER_CLUSTER = 8, 15
# one thread (fast on a busy machine) and no row or column sampling: the two fits differ only by the LLM columns
CONFIG = TOY_CONFIG.model_copy(update={"cold_item_dropout": 0.0, "young_item_copies": 0.0, "num_threads": 1, "feature_fraction": 1.0,
                                       "bagging_fraction": 1.0})


def cluster_split(n_users: int = 160, seed: int = 0) -> Split:
    """Each user picks 4-5 items of one cluster of ``PER_CLUSTER``; categories, years and audiences are
    drawn independently of the cluster, and histories are too short for the follow counts to learn
    the clusters, so only an embedding that knows them tells the label's cluster."""
    rng = np.random.default_rng(seed)
    n_items = N_CLUSTERS * PER_CLUSTER
    seqs, stamps = [], []
    for u in range(n_users):
        cluster, length = int(rng.integers(N_CLUSTERS)), int(rng.integers(4, 6))
        seqs.append((cluster * PER_CLUSTER + rng.choice(PER_CLUSTER, size=length, replace=False)).tolist())
        stamps.append([1_000_000 + u * 50_000 + 3_600 * j for j in range(length)])
    items = pd.DataFrame({"item_id": [f"i{i}" for i in range(n_items)],
                          "categories": [[f"g{int(g)}"] for g in rng.integers(4, size=n_items)],
                          "year": [1990 + int(y) for y in rng.integers(20, size=n_items)],
                          "audience": [("all", "teen", "adult")[int(a)] for a in rng.integers(3, size=n_items)]})
    users = pd.DataFrame({"user_id": [f"u{u}" for u in range(n_users)], "age": [30] * n_users,
                          "gender": ["M"] * n_users, "occupation": ["other"] * n_users})
    return split_from_sequences(seqs, items, users, stamps)


@pytest.fixture(scope="module")
def clusters() -> Split:
    return cluster_split()


def embeddings(kind: str, n_items: int) -> ItemEmbeddings:
    rng = np.random.default_rng(1)
    if kind == "signal":  # the item's cluster, blurred
        vectors = np.repeat(np.eye(N_CLUSTERS), PER_CLUSTER, axis=0) + 0.3 * rng.normal(size=(n_items, N_CLUSTERS))
    else:  # pure noise
        vectors = rng.normal(size=(n_items, 16))
    return ItemEmbeddings.from_vectors(vectors, n_items)


def served_valid_ndcg(split: Split, root: Path) -> float:
    """NDCG@10 over every valid query of the coarse ranker loaded from ``root/coarse``, as the training
    report computes ``valid_ndcg@10_coarse`` (a query without its label among the candidates counts 0)."""
    stage = CoarseStage(StageSpec(name="coarse", kind="coarse"), CoarseConfig())
    stage.load(root)
    groups = build_groups(split, PopularityStage(split), "valid", progress=False)
    ranked = stage.score_many(groups.requests, groups.candidates)
    top = np.full((len(ranked), 10), -1, np.int64)
    for g, cands in enumerate(ranked):
        top[g, :min(10, len(cands))] = cands.items[:10]
    return float(per_user_metrics(top, groups.labels, 10)["ndcg@10"].sum() / len(groups))


def test_the_setting_takes_auto_true_or_false():
    assert CoarseConfig().llm_embedding_features == "auto"
    assert CoarseConfig(llm_embedding_features="true").llm_embedding_features is True  # as an env value reads
    assert CoarseConfig(llm_embedding_features=False).llm_embedding_features is False
    with pytest.raises(ValidationError, match="llm_embedding_features"):
        CoarseConfig(llm_embedding_features="sometimes")
    assert fixed_choice(CoarseConfig(llm_embedding_features=True)) == {
        "chosen": True, "why": "coarse.llm_embedding_features is true"}


def test_auto_without_embeddings_is_off_and_says_why(clusters, tmp_path):
    report = train_coarse(clusters, PopularityStage(clusters), tmp_path / "auto", CONFIG, seed=7, progress=False)
    assert CONFIG.llm_embedding_features == "auto"
    assert report["llm_embedding_features"] == {"chosen": False, "why": NO_EMBEDDINGS}
    meta = json.loads((tmp_path / "auto" / "meta.json").read_text())
    assert meta["config"]["llm_embedding_features"] is False  # what the model was fitted with, never auto
    assert not set(LLM_EMBEDDING_FEATURES) & set(meta["feature_names"])
    off = CONFIG.model_copy(update={"llm_embedding_features": False})
    fixed = train_coarse(clusters, PopularityStage(clusters), tmp_path / "off", off, seed=7, progress=False)
    assert fixed["llm_embedding_features"] == {"chosen": False, "why": "coarse.llm_embedding_features is false"}
    assert (tmp_path / "auto" / "model.txt").read_bytes() == (tmp_path / "off" / "model.txt").read_bytes()
    why = "no LLM item embeddings in art/tags; `recsys tag --method embed` writes them"
    told = train_coarse(clusters, PopularityStage(clusters), tmp_path / "told", CONFIG, seed=7, progress=False,
                        llm_missing=why)
    assert told["llm_embedding_features"] == {"chosen": False, "why": why}


@pytest.mark.parametrize(("kind", "chosen"), [("signal", True), ("noise", False)])
def test_auto_serves_the_columns_only_where_they_lift_on_valid(clusters, tmp_path, kind, chosen):
    llm = embeddings(kind, clusters.n_items)
    report = train_coarse(clusters, PopularityStage(clusters), tmp_path / "auto" / "coarse", CONFIG, seed=7,
                          progress=False, llm=llm)
    verdict = report["llm_embedding_features"]
    assert verdict["chosen"] is chosen and verdict["dropout"] == 0.0
    assert (verdict["gate"]["ci95"][0] > 0) is chosen
    assert verdict["gate"]["mean"] == pytest.approx(verdict["valid_ndcg"]["with"] - verdict["valid_ndcg"]["without"],
                                                    abs=2e-5)
    assert verdict["why"].startswith(f"coarse.llm_embedding_features auto: {'on' if chosen else 'off'}")
    if kind == "signal":  # a label the embeddings know: a lift far beyond the spread
        assert verdict["valid_ndcg"]["with"] > verdict["valid_ndcg"]["without"] + 0.05
    # the served model is the one the fixed setting trains, bit for bit, and meta.json records that setting
    fixed = train_coarse(clusters, PopularityStage(clusters), tmp_path / "fixed" / "coarse",
                         CONFIG.model_copy(update={"llm_embedding_features": chosen}), seed=7, progress=False,
                         llm=llm if chosen else None)
    for name in ("model.txt", "features.npz", "features.json"):
        assert (tmp_path / "auto" / "coarse" / name).read_bytes() == (tmp_path / "fixed" / "coarse" / name).read_bytes()
    meta = json.loads((tmp_path / "auto" / "coarse" / "meta.json").read_text())
    assert meta["config"]["llm_embedding_features"] is chosen
    assert (set(LLM_EMBEDDING_FEATURES) <= set(meta["feature_names"])) is chosen
    own = ("seconds", "llm_embedding_features", "cold_item_dropout")  # auto chose the dropout without the columns
    assert {k: v for k, v in report.items() if k not in own} == {k: v for k, v in fixed.items() if k not in own}
    # loaded back, it scores the valid queries exactly as training did
    assert served_valid_ndcg(clusters, tmp_path / "auto") == report["valid_ndcg@10_coarse"]


@pytest.mark.parametrize(("kind", "chosen"), [("signal", True), ("noise", False)])
def test_with_row_and_column_sampling_the_verdict_averages_fits_at_several_seeds(clusters, tmp_path, kind, chosen):
    """At seed 0 with 0.8 sampling, a single fit per side leaves the embeddings that know the clusters
    off (paired CI across zero); the mean over the gate's fit seeds serves them, and noise stays off."""
    sampled = CONFIG.model_copy(update={"feature_fraction": 0.8, "bagging_fraction": 0.8})
    report = train_coarse(clusters, PopularityStage(clusters), tmp_path / "coarse", sampled, seed=0, progress=False,
                          llm=embeddings(kind, clusters.n_items))
    verdict = report["llm_embedding_features"]
    assert verdict["fit_seeds"] == [0, 1, 2]
    assert verdict["chosen"] is chosen and (verdict["gate"]["ci95"][0] > 0) is chosen


def test_without_llm_is_the_builder_fitted_without_them_and_its_columns_a_subset(clusters):
    llm = embeddings("signal", clusters.n_items)
    on = CONFIG.model_copy(update={"llm_embedding_features": True})
    full = FeatureBuilder(on).fit(clusters, score_columns=["recall_pop"], flag_columns=["src_pop"], llm=llm)
    base, keep = without_llm(full)
    off = FeatureBuilder(on.model_copy(update={"llm_embedding_features": False})).fit(
        clusters, score_columns=["recall_pop"], flag_columns=["src_pop"])
    assert base.feature_names == off.feature_names == [n for n in full.feature_names if n not in LLM_EMBEDDING_FEATURES]
    assert base.llm is None and base.config.llm_embedding_features is False
    history = clusters.train_sequences[3]
    new_item = clusters.n_items - 1  # hidden interactions keep their columns by name, not by position
    full.tables.log_pop[new_item] = 0.0
    req = Request(user_id="u3", history=history)
    cands = Candidates(items=np.array([0, 17, 44, new_item]), scores={"recall": np.array([4, 3, 2, 1], np.float32)})
    np.testing.assert_array_equal(full.transform(req, cands)[:, keep], base.transform(req, cands))
