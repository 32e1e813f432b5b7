"""The embedding-only mode (jobs.tagging.hidden_states): shapes, determinism, resuming, what it refuses,
and the coarse ranker's embeddings read from what it writes (jobs.tagging.embed.coarse_item_embeddings)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from jobs.coarse_tags import load_item_tags
from jobs.tagging.embed import EmbedSettings, coarse_item_embeddings, load_hidden
from jobs.tagging.generate import TaggerSettings, pooled_states
from jobs.tagging.hidden_states import HiddenEncoder, HiddenSettings, embed_catalog
from jobs.tagging.run import TagOptions, tag_catalog
from jobs.tagging.wiring import write_tagged_items
from jobs.train import holdout_sequences
from tests.jobs.tagging.factories import catalog_split, prepared_again, tiny_model_dir

SETTINGS = HiddenSettings(threads=1)
EMBED = EmbedSettings(epochs=3, dim=16, seed=0)


def texts_of(split) -> list[str]:
    return [f"{t} ({c[0]})" for t, c in zip(split.items["title"], split.items["categories"], strict=True)]


def run(split, root: Path, **kw) -> dict:
    return embed_catalog(split, str(tiny_model_dir()), root, texts_of(split), SETTINGS, embed=EMBED, chunk_size=4,
                         batch_size=3, progress=False, **kw)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_item_gets_a_pooled_state_and_a_unit_256d_style_projection(tmp_path):
    split = catalog_split(10)
    summary = run(split, tmp_path)
    tags = tmp_path / "tags"
    hidden, vectors = np.load(tags / "hidden.npy"), np.load(tags / "embed" / "embeddings.npy")
    assert hidden.shape[0] == 10 and hidden.dtype == np.float32 and np.isfinite(hidden).all()
    assert vectors.shape == (10, EMBED.dim)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    assert list(pd.read_parquet(tags / "tags.parquet").columns) == ["item_idx", "item_id"]
    assert summary["table_written"] and summary["items"] == 10 and summary["version"]["method"] == "embed"
    assert summary["projection"]["dim"] == EMBED.dim


def test_the_states_are_the_pooled_last_layer_of_each_batch(tmp_path):
    split = catalog_split(6)
    run(split, tmp_path)
    encoder = HiddenEncoder(str(tiny_model_dir()), texts_of(split), SETTINGS).load()
    direct = pooled_states(encoder.model, encoder.tok, texts_of(split)[:3], SETTINGS.max_tokens)  # batch 0
    np.testing.assert_array_equal(np.load(tmp_path / "tags" / "hidden.npy")[:3], np.stack(direct))


def test_a_rerun_and_a_resumed_run_give_identical_files(tmp_path):
    split = catalog_split(10)
    run(split, tmp_path / "a")
    run(split, tmp_path / "b")
    (tmp_path / "b" / "tags" / "parts" / "chunk-00001.parquet").unlink()
    again = run(split, tmp_path / "b")
    assert again["items_encoded_this_run"] == 4
    for name in ("hidden.npy", "tags.parquet", "embed/embeddings.npy"):
        assert digest(tmp_path / "a" / "tags" / name) == digest(tmp_path / "b" / "tags" / name), name


def test_a_limit_run_writes_no_table_and_a_full_run_completes_it(tmp_path):
    split = catalog_split(10)
    short = run(split, tmp_path, limit=5)
    assert not short["table_written"] and "projection" not in short
    assert not (tmp_path / "tags" / "hidden.npy").exists()
    full = run(split, tmp_path)
    assert full["items_encoded_this_run"] == 10 - 4 and full["table_written"]  # chunk 0 (items 0-3) was kept


def test_other_texts_or_a_tagging_run_are_refused_not_mixed(tmp_path):
    split = catalog_split(8)
    run(split, tmp_path)
    with pytest.raises(ValueError, match="another item titles or texts"):
        embed_catalog(split, str(tiny_model_dir()), tmp_path, [t.upper() for t in texts_of(split)], SETTINGS,
                      embed=EMBED, chunk_size=4, batch_size=3, progress=False)
    tagged = tmp_path / "tagged"
    tag_catalog(split, str(tiny_model_dir()), tagged, TaggerSettings(precision="fp32", max_new_tokens=24, threads=1),
                TagOptions(chunk_size=4, batch_size=4, progress=False))
    with pytest.raises(ValueError, match="rerun with --fresh"):
        run(split, tagged)
    assert run(split, tagged, fresh=True)["table_written"]


def test_readers_of_tags_refuse_an_ids_only_table_by_name(tmp_path):
    split = catalog_split(8)
    run(split, tmp_path)
    table = str(tmp_path / "tags" / "tags.parquet")
    with pytest.raises(ValueError, match=f"{table}: holds no tags"):
        write_tagged_items(split, tmp_path / "tags")
    with pytest.raises(ValueError, match=f"{table}: holds no tags"):
        load_item_tags(split, tmp_path / "tags", 1, EMBED)


def test_coarse_embeddings_are_read_from_the_job_s_states_and_refuse_a_missing_or_foreign_file(tmp_path):
    split = catalog_split(10)
    sequences = holdout_sequences(split, 1)[0]
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'tags' / 'hidden.npy'} missing"):
        coarse_item_embeddings(split, tmp_path / "tags", sequences, EMBED)
    run(split, tmp_path)
    first = coarse_item_embeddings(split, tmp_path / "tags", sequences, EMBED)
    assert first.vectors.shape == (10, EMBED.dim)
    np.testing.assert_array_equal(first.vectors, coarse_item_embeddings(split, tmp_path / "tags", sequences,
                                                                        EMBED).vectors)  # seeded: deterministic
    with pytest.raises(ValueError, match="version.json: the hidden states were made for another catalog"):
        load_hidden(tmp_path / "tags", prepared_again(split).items["item_id"].tolist())
    shutil.rmtree(tmp_path / "tags")
    with pytest.raises(FileNotFoundError, match="hidden.npy missing"):
        load_hidden(tmp_path / "tags", split.items["item_id"].tolist())
