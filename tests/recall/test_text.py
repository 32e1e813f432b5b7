"""Item text strings, cache keys and the real MiniLM encoder (slow: loads the model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from recall.text import TEXT_DIM, cache_key, embed_items, item_texts


def test_item_texts_join_title_and_text_without_repeating_the_title():
    items = pd.DataFrame({"title": ["Heat (1995)", "Up.", "Alien"], "text": ["", "A house flies.", "Alien. Sci-Fi."]})
    assert item_texts(items) == ["Heat (1995).", "Up. A house flies.", "Alien. Sci-Fi."]


def test_cache_key_depends_on_texts_order_and_model():
    assert cache_key(["a", "b"]) == cache_key(["a", "b"])
    assert len({cache_key(["a", "b"]), cache_key(["b", "a"]), cache_key(["ab"]), cache_key(["a", "b"], "m")}) == 4


@pytest.mark.slow
def test_embed_items_normalised_semantic_and_cached(tmp_path: Path):
    items = pd.DataFrame({
        "title": ["Star Wars (1977)", "Return of the Jedi (1983)", "Sense and Sensibility (1995)"],
        "text": ["Space opera with Jedi knights.", "Star Wars sequel with Jedi.", "Romance in Regency England."],
    })
    vecs = embed_items(items, tmp_path)
    assert vecs.shape == (3, TEXT_DIM) and vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert vecs[0] @ vecs[1] > vecs[0] @ vecs[2]  # the two Star Wars films are nearer each other
    (cached,) = list(tmp_path.glob("*.npy"))
    np.save(cached, np.zeros_like(vecs))  # a planted cache entry proves the second call reads it
    assert not embed_items(items, tmp_path).any()


def test_the_text_cache_is_the_machines_and_follows_the_environment(monkeypatch, tmp_path) -> None:
    from recall.text import text_cache_dir

    monkeypatch.setenv("RECSYS_CACHE_DIR", str(tmp_path / "c"))
    assert text_cache_dir() == tmp_path / "c" / "text"
    monkeypatch.delenv("RECSYS_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert text_cache_dir() == tmp_path / "xdg" / "recsys" / "text"
