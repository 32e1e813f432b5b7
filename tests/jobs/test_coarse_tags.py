"""The tag-feature coarse model from artifacts (jobs.coarse_tags) and its ablation variants."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cascade.registry import build_stage
from cascade.settings import Settings
from coarse_rank.feature_names import TAG_FEATURES
from jobs.coarse_tags import SOURCE_FILE, SUBDIR, ensure_coarse_tags, holdout_embeddings, is_current
from jobs.tagging.ablation import VARIANTS, variant_settings
from jobs.tagging.embed import EmbedSettings
from recall.train import train_two_tower
from recsys.contract import Candidates, Request
from tests.coarse_rank.test_features import ITEMS, SEQS, USERS
from tests.coarse_rank.toy import split_from_sequences
from tests.recall.two_tower_factories import successor_split

TINY_EMBED = EmbedSettings(dim=8, hidden=16, epochs=2, batch_size=64)
TINY = {"recall": {"dim": 16, "max_len": 8, "n_blocks": 1, "n_heads": 2, "max_epochs": 2, "eval_every": 1,
                   "use_text": False, "train_threads": 1},
        "coarse": {"n_estimators": 10, "min_child_samples": 5, "early_stopping_rounds": 5, "train_positions": 1,
                   "max_train_users": 30}}


def write_tags(tags_dir: Path, item_ids: list[str], fallback_every: int = 7) -> None:
    """A tagging job's outputs written by hand for items ``item_ids``: tags.parquet, hidden.npy, version.json."""
    tags_dir.mkdir(parents=True, exist_ok=True)
    n_items = len(item_ids)
    pd.DataFrame({
        "item_idx": range(n_items), "item_id": item_ids, "fallback": [i % fallback_every == 3 for i in range(n_items)],
        "genres": [[("Action", "Comedy", "Drama")[i % 3]] for i in range(n_items)],
        "themes": [["dark" if i % 2 else "funny"] for i in range(n_items)],
        "risk_flags": [["violence"] if i % 5 == 0 else [] for i in range(n_items)],
        "audience": ["all"] * n_items, "summary": ["x"] * n_items,
    }).to_parquet(tags_dir / "tags.parquet", index=False)
    np.save(tags_dir / "hidden.npy", np.random.default_rng(0).normal(size=(n_items, 12)).astype(np.float32))
    (tags_dir / "version.json").write_text(json.dumps({"schema_hash": "toy"}))


def test_holdout_embeddings_never_train_on_the_label_transitions(monkeypatch):
    import jobs.tagging.embed as embed  # holdout_embeddings projects through embed.project_hidden

    split = split_from_sequences(SEQS, ITEMS, USERS)  # train sequences [0,1,2], [1,2,3], [0,2,4]
    seen = []
    real = embed.train_projection
    monkeypatch.setattr(embed, "train_projection", lambda h, pairs, s: (seen.append(pairs), real(h, pairs, s))[1])
    hidden = np.random.default_rng(1).normal(size=(5, 6)).astype(np.float32)
    vectors, report = holdout_embeddings(split, hidden, 1, TINY_EMBED)
    assert seen[0].tolist() == [[0, 1], [1, 2], [0, 2]]  # labels 2, 3, 4 cut: 1->2 (u0), 2->3, 2->4 gone
    assert report["pairs"] == 3 and len(report["loss_per_epoch"]) == TINY_EMBED.epochs
    assert vectors.shape == (5, 8) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    with pytest.raises(ValueError, match="4 pooled hidden states for a catalog of 5"):
        holdout_embeddings(split, hidden[:4], 1, TINY_EMBED)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> tuple[Path, Settings]:
    """split/, recall_holdout/ (a tiny two-tower) and hand-written tags/."""
    root, settings = tmp_path_factory.mktemp("artifacts"), Settings.build(TINY)
    split = successor_split()
    split.save(root / "split")
    train_two_tower(split, root / "recall_holdout", settings.recall, progress=False)
    write_tags(root / "tags", split.items["item_id"].tolist())
    return root, settings


def test_coarse_tags_trains_from_artifacts_is_reused_and_serves_without_tags(artifacts, tmp_path):
    from offline.split import Split

    src, settings = artifacts
    root = tmp_path / "art"
    shutil.copytree(src, root)
    split = Split.load(root / "split")
    first = ensure_coarse_tags(settings, root, split, embed=TINY_EMBED, progress=False)
    assert first["trained"] and first["report"]["embedding"]["holdout_positions"] == 1
    assert {p.name for p in (root / SUBDIR).iterdir()} >= {"model.txt", "features.npz", "meta.json", SOURCE_FILE}
    from offline.split import split_id  # serving refuses it once the split is prepared again
    assert json.loads((root / SUBDIR / "stage.json").read_text())["split_id"] == split_id(root)
    assert not ensure_coarse_tags(settings, root, split, embed=TINY_EMBED, progress=False)["trained"]
    write_tags(root / "tags", split.items["item_id"].tolist(), fallback_every=4)  # re-tagged: the model is stale
    assert not is_current(settings, root, TINY_EMBED)
    shutil.rmtree(root / "tags")  # serving reads coarse_tags/ only
    spec = next(s for s in variant_settings(settings, "tag_features").pipeline.stages if s.kind == "coarse")
    stage = build_stage(spec, settings)
    stage.load(root)
    req = Request(user_id="u0", history=split.train_sequences[0])
    cands = Candidates(items=np.arange(10), scores={"recall": np.linspace(1, 0, 10).astype(np.float32)})
    out = stage.run(req, cands)
    assert sorted(out.items.tolist()) == list(range(10)) and np.isfinite(out.scores["coarse"]).all()
    names = json.loads((root / SUBDIR / "meta.json").read_text())["feature_names"]
    assert set(TAG_FEATURES) <= set(names)


def test_coarse_tags_recalls_its_train_groups_without_their_labels_in_the_popularity(artifacts, tmp_path,
                                                                                       monkeypatch):
    import jobs.coarse_tags as coarse_tags
    from coarse_rank.dataset import prefix_popularity
    from offline.split import Split

    src, settings = artifacts
    root = tmp_path / "art"
    shutil.copytree(src, root)
    split = Split.load(root / "split")
    seen = {}
    real = coarse_tags.train_coarse
    monkeypatch.setattr(coarse_tags, "train_coarse", lambda sp, stage, *a, **kw: (
        seen.update(valid=stage, train=kw["train_stage"]), real(sp, stage, *a, **kw))[1])
    coarse_tags.train_coarse_tags(settings, root, split, embed=TINY_EMBED, progress=False)
    positions = settings.coarse.train_positions
    np.testing.assert_array_equal(seen["train"]._popularity.popularity, prefix_popularity(split, positions))
    np.testing.assert_array_equal(seen["valid"]._popularity.popularity, split.item_popularity("valid"))
    assert is_current(settings, root, TINY_EMBED)
    monkeypatch.setattr(coarse_tags, "TRAINING_REVISION", coarse_tags.TRAINING_REVISION + 1)  # a training fix since
    assert not is_current(settings, root, TINY_EMBED)


def test_coarse_tags_needs_tags_for_the_whole_catalog(artifacts, tmp_path):
    from jobs.coarse_tags import train_coarse_tags
    from offline.split import Split

    src, settings = artifacts
    root = tmp_path / "art"
    shutil.copytree(src, root)
    split = Split.load(root / "split")
    write_tags(root / "tags", split.items["item_id"].tolist()[:-2])
    with pytest.raises(ValueError, match=f"tags cover {split.n_items - 2} items.*catalog has {split.n_items}"):
        train_coarse_tags(settings, root, split, embed=TINY_EMBED, progress=False)
    write_tags(root / "tags", split.items["item_id"].tolist()[::-1])  # tagged before the split was prepared again
    with pytest.raises(ValueError, match="tags.parquet: row 0 holds the tags of item .* another catalog"):
        train_coarse_tags(settings, root, split, embed=TINY_EMBED, progress=False)
    shutil.rmtree(root / "recall_holdout")
    with pytest.raises(FileNotFoundError, match="recall_holdout"):
        train_coarse_tags(settings, root, split, embed=TINY_EMBED, progress=False)


def test_ablation_variants_swap_the_coarse_model_and_recall():
    settings = Settings.from_yaml(None)
    assert VARIANTS == ("base", "llm_channel", "tagged_rules", "tag_features", "all")

    def stages(variant):
        return {s.name: s for s in variant_settings(settings, variant, 0.3).pipeline.stages}

    base, tag, both = stages("base"), stages("tag_features"), stages("all")
    assert tag["coarse"].params == {"subdir": "coarse_tags"} and tag["coarse"].kind == "coarse"
    assert tag["recall"] == base["recall"] and tag["rules"] == base["rules"] and base["coarse"].params == {}
    assert both["coarse"].params == {"subdir": "coarse_tags"}
    assert both["recall"].kind == "recall_llm" and both["recall"].params["llm_share"] == 0.3
    assert both["rules"].kind == "rules" and both["coarse"].depth == base["coarse"].depth
    with pytest.raises(ValueError, match="unknown ablation variant 'tags'"):
        variant_settings(settings, "tags")
