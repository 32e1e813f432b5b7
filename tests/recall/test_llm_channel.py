"""The LLM-embedding channel loads only embeddings made for the split's catalog (ids, in order)."""

import json
from pathlib import Path

import numpy as np
import pytest

from jobs.tagging.generate import TaggerSettings
from jobs.tagging.job import job_version
from jobs.tagging.schema import catalog_categories, concrete_schema
from offline.tag_store import catalog_digest
from recall.config import RecallConfig
from recall.index import ItemIndex
from recall.llm_channel import LLMChannelRecallStage, LLMEmbeddingChannel
from recall.stage import RecallStage
from recsys.config import StageSpec
from tests.jobs.tagging.factories import catalog_split, prepared_again, tiny_model_dir

VECTORS = np.array([[1, 0], [0.8, 0.6], [0, 1], [-1, 0]], dtype=np.float32)


def _embed_dir(art: Path, item_ids: list[str], vectors: np.ndarray = VECTORS) -> Path:
    """``<art>/tags/embed`` as ``jobs.tagging.embed.train_embeddings`` writes it, made for ``item_ids``."""
    embed = art / "tags" / "embed"
    embed.mkdir(parents=True)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    np.save(embed / "embeddings.npy", unit, allow_pickle=False)
    ItemIndex.build(unit, "flat").save(embed / "index")
    (embed / "meta.json").write_text(json.dumps({"tags_version": {"catalog": catalog_digest(item_ids)},
                                                 "n_items": len(unit)}))
    return embed


def test_the_digest_is_the_one_the_tagging_job_records():
    split = catalog_split(4)
    schema = concrete_schema(catalog_categories(split.items["categories"]))
    version = job_version(str(tiny_model_dir()), schema, TaggerSettings(), 2, 2, split.items["item_id"])
    assert version["catalog"] == catalog_digest(["i0", "i1", "i2", "i3"])


def test_embeddings_of_the_split_s_catalog_load_and_rank_by_item_idx(tmp_path: Path):
    _embed_dir(tmp_path, ["i0", "i1", "i2", "i3"])
    channel = LLMEmbeddingChannel.load(tmp_path, ["i0", "i1", "i2", "i3"], window=1)
    ids, _ = channel.candidates(np.array([0]), exclude=np.array([0]), n=2)
    assert ids.tolist() == [1, 2]


def test_embeddings_of_the_catalog_before_prepare_ran_again_are_refused(tmp_path: Path):
    embed = _embed_dir(tmp_path, ["i0", "i1", "i2", "i3"])
    with pytest.raises(ValueError, match=rf"{embed / 'meta.json'}: the embeddings were made for another catalog "
                                         r".*prepared again; re-run `recsys tag --method embed --fresh` \(or `recsys tag --fresh` then "
                                         r"`recsys tag embed-train`\)"):
        LLMEmbeddingChannel.load(tmp_path, ["i3", "i2", "i1", "i0"])  # same items, another order


def test_a_catalog_with_another_item_count_is_refused(tmp_path: Path):
    embed = _embed_dir(tmp_path, ["i0", "i1", "i2", "i3"])
    with pytest.raises(ValueError, match=rf"{embed / 'embeddings.npy'}: 4 item embeddings but the split has 5 items"):
        LLMEmbeddingChannel.load(tmp_path, ["i0", "i1", "i2", "i3", "i4"])


def test_embeddings_that_do_not_name_their_catalog_are_refused(tmp_path: Path):
    embed = _embed_dir(tmp_path, ["i0", "i1", "i2", "i3"])
    (embed / "meta.json").write_text(json.dumps({"tags_version": {}, "n_items": 4}))
    with pytest.raises(ValueError, match=rf"{embed / 'meta.json'}: does not say which catalog"):
        LLMEmbeddingChannel.load(tmp_path, ["i0", "i1", "i2", "i3"])


def test_the_stage_checks_the_embeddings_against_the_split_on_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(RecallStage, "load", lambda self, artifact_dir, subdir="recall", phase="test": None)  # no recall model here
    split = catalog_split(4)
    _embed_dir(tmp_path, split.items["item_id"].tolist())
    spec = StageSpec(name="recall", kind="recall_llm", depth=3, params={"llm_share": 0.5})
    prepared_again(split).save(tmp_path / "split")  # `recsys prepare` rebuilt it: item_idx 0 is now i3
    with pytest.raises(ValueError, match="made for another catalog"):
        LLMChannelRecallStage(spec, RecallConfig()).load(tmp_path)
    split.save(tmp_path / "split")
    stage = LLMChannelRecallStage(spec, RecallConfig())
    stage.load(tmp_path)
    assert stage._llm is not None and len(stage._llm.vectors) == 4
