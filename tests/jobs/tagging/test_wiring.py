import json

import numpy as np
import pandas as pd

from jobs.tagging.embed import EmbedSettings, train_embeddings
from jobs.tagging.generate import TaggerSettings
from jobs.tagging.run import TagOptions, tag_catalog
from jobs.tagging.wiring import merge_tags, write_tagged_items
from offline.tag_store import load_tagged_items
from recall.index import ItemIndex
from recall.llm_channel import LLMEmbeddingChannel
from rules.items import ItemAttributes
from tests.jobs.tagging.factories import catalog_split, tiny_model_dir


def _tags(n: int) -> pd.DataFrame:
    return pd.DataFrame({"item_idx": range(n), "item_id": [f"i{i}" for i in range(n)], "fallback": [False, True, False][:n],
                         "genres": [["Horror"], [], ["Animation"]][:n], "themes": [["dark"], [], ["family"]][:n],
                         "risk_flags": [["violence"], [], []][:n], "audience": ["adult", None, "all"][:n],
                         "summary": ["A killer.", "", "A toy."][:n]})


def test_merge_fills_missing_audience_only_and_rules_see_the_tags():
    items = catalog_split(3).items.copy()
    items.loc[2, "audience"] = "teen"  # the catalog's own value wins over the tag's "all"
    merged = merge_tags(items, _tags(3))
    assert merged["audience"].tolist() == ["adult", None, "teen"]
    assert json.loads(merged.loc[0, "attributes"])["tags"] == ["genre:Horror", "theme:dark", "risk:violence"]
    assert json.loads(merged.loc[1, "attributes"])["tags"] == []  # fallback: no claims
    attrs = ItemAttributes.from_items(merged)
    assert attrs.tags[:, attrs.tag_columns(["risk:violence"])].ravel().tolist() == [True, False, False]
    assert items["attributes"].tolist() == catalog_split(3).items["attributes"].tolist()  # input untouched


def test_channel_queries_with_the_recent_history_centroid():
    vectors = np.array([[1, 0], [0.8, 0.6], [0, 1], [-1, 0]], dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    channel = LLMEmbeddingChannel(vectors, ItemIndex.build(vectors, "flat"), window=1)
    ids, scores = channel.candidates(np.array([2, 0]), exclude=np.array([0]), n=2)
    assert ids.tolist() == [1, 2] and scores[0] > scores[1]  # window 1: only item 0 counts
    assert channel.candidates(np.array([], dtype=np.int64), np.array([]), 3)[0].tolist() == []


def test_tag_embed_merge_end_to_end_on_a_tiny_catalog(tmp_path):
    split = catalog_split(8)
    tag_catalog(split, str(tiny_model_dir()), tmp_path, TaggerSettings(precision="fp32", threads=1),
                TagOptions(chunk_size=4, batch_size=4, progress=False))
    meta = train_embeddings(split, tmp_path / "tags", EmbedSettings(dim=16, hidden=32, epochs=40, batch_size=8))
    assert meta["n_items"] == 8 and meta["loss_per_epoch"][-1] < meta["loss_per_epoch"][0]
    channel = LLMEmbeddingChannel.load(tmp_path, split.items["item_id"].tolist(), window=5)
    assert np.allclose(np.linalg.norm(channel.vectors, axis=1), 1.0, atol=1e-5)
    report = write_tagged_items(split, tmp_path / "tags")
    assert report["items"] == 8 and len(load_tagged_items(tmp_path)) == 8


def test_embed_train_replaces_its_four_outputs_as_one_set(tmp_path):
    split = catalog_split(8)
    tag_catalog(split, str(tiny_model_dir()), tmp_path, TaggerSettings(precision="fp32", threads=1),
                TagOptions(chunk_size=8, batch_size=8, progress=False))
    tags_dir = tmp_path / "tags"
    train_embeddings(split, tags_dir, EmbedSettings(dim=16, hidden=32, epochs=2, batch_size=8))
    (tags_dir / "embed" / "mlp.pt").unlink()
    (tags_dir / "embed" / "mlp.pt").mkdir()  # in the way of an in-place torch.save (the finding's stand-in)
    meta = train_embeddings(split, tags_dir, EmbedSettings(dim=8, hidden=32, epochs=2, batch_size=8))
    embed = tags_dir / "embed"
    assert np.load(embed / "embeddings.npy").shape == (8, 8) and (embed / "mlp.pt").is_file()
    assert json.loads((embed / "meta.json").read_text())["settings"]["dim"] == meta["settings"]["dim"] == 8
    assert ItemIndex.load(embed / "index").dim == 8
    assert sorted(p.name for p in tags_dir.iterdir() if p.name.startswith(".")) == []  # no staging left behind


def test_ablation_variants_swap_only_the_named_stage_kinds():
    from cascade.settings import Settings
    from jobs.tagging.ablation import variant_settings

    settings = Settings.from_yaml(None)
    kinds = {s.name: s.kind for s in variant_settings(settings, "llm_channel", 0.3).pipeline.stages}
    assert kinds["recall"] == "recall_llm" and kinds["rules"] == "rules"
    spec = next(s for s in variant_settings(settings, "llm_channel", 0.3).pipeline.stages if s.name == "recall")
    assert spec.params["llm_share"] == 0.3
    tagged = {s.name: s.kind for s in variant_settings(settings, "tagged_rules").pipeline.stages}
    assert tagged["rules"] == tagged["caps"] == "rules_tagged" and tagged["recall"] == "recall"
