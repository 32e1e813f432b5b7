"""Two-tower shapes, normalisation, causality and order-awareness, plus feature encoding."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from recall.features import ItemFeatures, UserVocab, age_bucket, year_bucket
from recall.towers import BOS, PAD, ItemTower, UserTower, history_batch

DIM = 16


def _items(n: int = 12) -> pd.DataFrame:
    return pd.DataFrame({
        "title": [f"t{i}" for i in range(n)],
        "categories": [["A", "B"] if i % 2 else ["C"] for i in range(n)],
        "audience": [("all", "teen", "adult", None)[i % 4] for i in range(n)],
        "year": pd.array([1995 if i % 3 else None for i in range(n)], dtype="Int64"),
    })


def _towers(max_len: int = 6, text: bool = True) -> tuple[ItemTower, UserTower]:
    torch.manual_seed(0)
    emb = np.random.default_rng(0).normal(size=(12, 5)).astype(np.float32) if text else None
    item = ItemTower(ItemFeatures.from_items(_items(), emb), DIM)
    user = UserTower(DIM, max_len, n_blocks=2, n_heads=2, dropout=0.0, attr_sizes=UserVocab(("F", "M"), ()).sizes)
    return item.eval(), user.eval()


def _encode(user: UserTower, vecs: torch.Tensor, hists: list[list[int]], attrs: list[list[int]] | None = None):
    seqs = torch.from_numpy(history_batch([np.array(h, dtype=np.int64) for h in hists], user.max_len))
    codes = torch.tensor(attrs if attrs is not None else [[0, 0, 0]] * len(hists))
    with torch.no_grad():
        return user.encode(vecs, seqs, codes)


def test_item_features_encode_categories_audience_and_decade():
    f = ItemFeatures.from_items(_items(4))
    assert f.category_names == ("A", "B", "C")
    assert f.categories.tolist() == [[0, 0, 1], [1, 1, 0], [0, 0, 1], [1, 1, 0]]
    assert f.audience.tolist() == [1, 2, 3, 0]
    assert f.year.tolist() == [0, 8, 8, 0]


def test_buckets_and_user_vocab_map_missing_and_unseen_to_zero():
    assert [age_bucket(a) for a in (None, np.nan, 17, 18, 56)] == [0, 0, 1, 2, 7]
    assert [year_bucket(y) for y in (pd.NA, 1919, 1920, 2024)] == [0, 1, 1, 11]
    vocab = UserVocab.from_users(pd.DataFrame({"gender": ["M", None, "F"], "occupation": ["nurse", "nurse", None]}))
    assert vocab == UserVocab(("F", "M"), ("nurse",))
    assert vocab.encode({"age": 20, "gender": "F", "occupation": "nurse"}).tolist() == [2, 1, 1]
    assert vocab.encode({"gender": "X"}).tolist() == [0, 0, 0]
    assert UserVocab.from_json(vocab.to_json()) == vocab


def test_history_batch_prepends_bos_truncates_and_left_pads():
    out = history_batch([np.array([3]), np.array([1, 2, 3, 4, 5])], 4)
    assert out.tolist() == [[PAD, PAD, BOS, 3], [2, 3, 4, 5]]


def test_item_tower_gives_unit_vectors_with_and_without_text():
    for text in (True, False):
        item, _ = _towers(text=text)
        with torch.no_grad():
            vecs = item.all_items()
        assert vecs.shape == (12, DIM)
        np.testing.assert_allclose(vecs.norm(dim=1).numpy(), 1.0, atol=1e-5)
    assert "text" not in item.state_dict()  # features are buffers outside the checkpoint


def test_user_tower_unit_vectors_and_empty_history():
    item, user = _towers()
    with torch.no_grad():
        vecs = item.all_items()
    out = _encode(user, vecs, [[1, 2, 3], [], [4]])
    assert out.shape == (3, DIM)
    assert torch.isfinite(out).all()
    np.testing.assert_allclose(out.norm(dim=1).numpy(), 1.0, atol=1e-5)


def test_user_tower_is_order_aware():
    item, user = _towers()
    with torch.no_grad():
        vecs = item.all_items()
    a, b = _encode(user, vecs, [[1, 2, 3, 4], [4, 3, 2, 1]])
    assert not torch.allclose(a, b, atol=1e-4)


def test_user_tower_is_causal_and_reads_only_the_last_max_len_items():
    item, user = _towers(max_len=4)
    with torch.no_grad():
        vecs = item.all_items()
        seqs = torch.tensor([[BOS, 1, 2, 3], [BOS, 1, 2, 9]])
        per_pos = user(vecs, seqs, torch.zeros(2, 3, dtype=torch.long))
    torch.testing.assert_close(per_pos[0, :3], per_pos[1, :3])  # earlier positions ignore the last item
    assert not torch.allclose(per_pos[0, 3], per_pos[1, 3])
    old_differs = _encode(user, vecs, [[7, 1, 2, 3, 4], [8, 1, 2, 3, 4]])
    torch.testing.assert_close(old_differs[0], old_differs[1])


def test_user_attributes_change_the_vector():
    item, user = _towers()
    with torch.no_grad():
        vecs = item.all_items()
        for param in user.attr_embs.parameters():  # fresh embeddings are near zero; make the effect visible
            param.normal_()
    a, b = _encode(user, vecs, [[], []], attrs=[[2, 1, 0], [5, 2, 0]])
    assert not torch.allclose(a, b, atol=1e-3)


def test_user_tower_rejects_sequences_longer_than_max_len():
    item, user = _towers(max_len=3)
    with pytest.raises(ValueError, match="max_len 3"):
        user(item.all_items(), torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long))


def test_an_unknown_item_is_placed_by_its_content_alone():
    torch.manual_seed(0)
    emb = np.random.default_rng(0).normal(size=(12, 5)).astype(np.float32)
    known = np.ones(12, dtype=bool)
    known[3] = False
    item = ItemTower(ItemFeatures.from_items(_items(), emb), DIM, known=known).eval()
    with torch.no_grad():
        vecs = item.all_items()
        item.id_emb.weight[3] += 100.0  # an unknown item's id embedding never reaches its vector
        item.id_emb.weight[4] += 100.0
        again = item.all_items()
    torch.testing.assert_close(vecs[3], again[3])
    assert not torch.allclose(vecs[4], again[4])


def test_id_dropout_hides_known_ids_in_training_only():
    emb = np.random.default_rng(0).normal(size=(12, 5)).astype(np.float32)
    torch.manual_seed(0)
    item = ItemTower(ItemFeatures.from_items(_items(), emb), DIM, id_dropout=0.5)
    content = ItemTower(ItemFeatures.from_items(_items(), emb), DIM, known=np.zeros(12, dtype=bool))
    content.load_state_dict(item.state_dict())
    with torch.no_grad():
        assert torch.allclose(item.eval().all_items(), item.all_items())  # eval: deterministic, ids kept
        assert not torch.allclose(item.all_items(), content.eval().all_items())
        train_vecs = item.train().all_items()
    same = torch.isclose(train_vecs, content.eval().all_items()).all(dim=1)
    assert 0 < int(same.sum()) < 12  # some ids dropped (content alone), some kept
    with pytest.raises(ValueError, match="known has 3 entries"):
        ItemTower(ItemFeatures.from_items(_items(), emb), DIM, known=np.ones(3, dtype=bool))


def test_the_category_part_is_the_projection_of_the_multi_hot_rows_and_trains_alike():
    features = ItemFeatures.from_items(_items(), None)
    tower = ItemTower(features, dim=8)
    assert tower.category_proj is not None and features.categories.sum(axis=1).min() >= 1
    dense = torch.from_numpy(features.categories)
    for items in (torch.arange(len(dense)), torch.tensor([3, 0, 3, len(dense) - 1]), torch.zeros(0, dtype=torch.long)):
        torch.testing.assert_close(tower._categories(items, tower.category_proj), tower.category_proj(dense[items]))
    weight = tower.category_proj.weight
    (sparse_grad,) = torch.autograd.grad(tower._categories(torch.arange(len(dense)), tower.category_proj).sum(), weight)
    (dense_grad,) = torch.autograd.grad(tower.category_proj(dense).sum(), weight)
    torch.testing.assert_close(sparse_grad, dense_grad)
