"""The eval report's ``llm_sources`` section: what the pipeline config and the coarse ranker's training
switched on, and why (``jobs.evaluation.llm_sources``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cascade.settings import Settings
from coarse_rank.llm_features import ItemEmbeddings
from coarse_rank.train import train_coarse
from jobs.evaluation.llm_sources import coarse_choice, llm_sources
from tests.coarse_rank.test_llm_gate import CONFIG, cluster_split, embeddings
from tests.coarse_rank.toy import PopularityStage


@pytest.fixture(scope="module")
def gated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """(artifact root whose coarse/ is the auto-gated ranker with the LLM columns on, its training report)."""
    root, split = tmp_path_factory.mktemp("art"), cluster_split()
    report = train_coarse(split, PopularityStage(split), root / "coarse", CONFIG, seed=7, progress=False,
                          llm=embeddings("signal", split.n_items))
    return root, report


def with_stages(settings: Settings, **changes: dict) -> Settings:
    """``settings`` with each named stage's fields updated."""
    stages = [s.model_copy(update=changes.get(s.name, {})) for s in settings.pipeline.stages]
    return settings.model_copy(update={"pipeline": settings.pipeline.model_copy(update={"stages": stages})})


def test_the_default_pipeline_reports_the_coarse_choice_and_no_other_llm_source(gated):
    root, report = gated
    sources = llm_sources(Settings.build(), root)
    entry = report["llm_embedding_features"]
    assert entry["chosen"] is True
    assert sources["coarse_llm_embedding_features"] == {"coarse": {k: entry[k] for k in ("chosen", "why", "valid_ndcg",
                                                                                          "gate")}}
    assert sources["llm_rerank"] == {"on": False, "why": "the pipeline config's llm stage is disabled"}
    assert sources["llm_recall_channel"] == {"on": False, "why": "no enabled stage of kind recall_llm in the pipeline"}
    assert sources["llm_tag_rules"]["on"] is False


def test_what_the_pipeline_config_switches_on_is_reported_on(gated):
    root, _ = gated
    settings = with_stages(Settings.build(), llm={"enabled": True}, recall={"kind": "recall_llm"},
                           coarse={"enabled": False})
    sources = llm_sources(settings, root)
    assert sources["llm_rerank"] == {"on": True, "why": "the pipeline config's llm stage is enabled"}
    assert sources["llm_recall_channel"] == {"on": True, "why": "enabled stage 'recall' of kind recall_llm"}
    assert sources["coarse_llm_embedding_features"] == {}  # no coarse stage served


def test_a_coarse_model_without_the_choice_in_its_report_is_read_from_its_features(gated, tmp_path):
    root, _ = gated
    assert coarse_choice(tmp_path) == {"chosen": False, "why": f"no trained coarse ranker in {tmp_path}"}
    meta = json.loads((root / "coarse" / "meta.json").read_text())
    del meta["report"]["llm_embedding_features"]  # a ranker trained when the report had no such entry
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    assert coarse_choice(tmp_path) == {"chosen": True,
                                       "why": "the model's feature names (its training report records no choice)"}


def test_a_fixed_setting_is_reported_as_set(tmp_path):
    split = cluster_split(n_users=60)
    on = CONFIG.model_copy(update={"llm_embedding_features": True})
    llm = ItemEmbeddings.from_vectors(np.random.default_rng(0).normal(size=(split.n_items, 4)), split.n_items)
    train_coarse(split, PopularityStage(split), tmp_path / "coarse", on, seed=7, progress=False, llm=llm)
    assert coarse_choice(tmp_path / "coarse") == {"chosen": True, "why": "coarse.llm_embedding_features is true"}
