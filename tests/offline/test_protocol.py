"""k-core filtering and the leave-one-out split, on hand-worked tables and on ML-100K."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from offline.protocol import k_core, make_split, outside_users
from offline.schema import DataError, Dataset, user_attributes
from offline.split import Split


def _inter(rows: list[tuple[str, str, int]]) -> pd.DataFrame:
    users, items, ts = zip(*rows, strict=True)
    return pd.DataFrame({"user_id": users, "item_id": items, "rating": 1.0, "timestamp": ts})


def test_k_core_cascades_until_stable() -> None:
    # z has 1 interaction -> drops; then c has only w -> drops; then w has only e -> drops;
    # then e has only x -> drops. a and b survive untouched.
    df = _inter([("a", "x", 1), ("a", "y", 2), ("b", "x", 3), ("b", "y", 4),
                 ("c", "w", 5), ("c", "z", 6), ("e", "w", 7), ("e", "x", 8)])
    out = k_core(df, k=2)
    assert out.index.tolist() == [0, 1, 2, 3]
    assert list(zip(out["user_id"], out["item_id"], strict=True)) == [("a", "x"), ("a", "y"), ("b", "x"), ("b", "y")]


def test_k_core_collapses_duplicates_to_latest_before_counting() -> None:
    # a rated x twice: it counts once, so with k=2 user a has 2 distinct items, not 3.
    df = _inter([("a", "x", 9), ("a", "x", 2), ("a", "y", 3), ("b", "x", 4), ("b", "y", 5)])
    out = k_core(df, k=2)
    assert out.index.tolist() == [0, 2, 3, 4]  # row 0 (t=9) is the latest (a, x)
    assert k_core(df, k=3).empty


def test_k_core_min_user_and_bad_input() -> None:
    df = _inter([("a", "x", 1), ("a", "y", 2), ("b", "x", 3)])
    assert k_core(df, k=1, min_user=2)["user_id"].tolist() == ["a", "a"]
    with pytest.raises(ValueError, match="k must be >= 1"):
        k_core(df, k=0)
    with pytest.raises(DataError, match="item_id"):
        k_core(df.drop(columns="item_id"), k=1)


def _tiny_dataset(swap_tied_rows: bool = False) -> Dataset:
    rows = [
        ("u1", "i1", 10), ("u1", "i2", 30), ("u1", "i3", 20),
        ("u2", "i3", 5), ("u2", "i1", 5), ("u2", "i2", 7),  # i3 and i1 tie at t=5
        ("u3", "i2", 1), ("u3", "i1", 2), ("u3", "i3", 3), ("u3", "i1", 4),  # (u3, i1) twice
        ("u4", "i1", 1), ("u4", "i2", 2),  # only 2 interactions: cannot be split
    ]
    if swap_tied_rows:
        rows[3], rows[4] = rows[4], rows[3]
    items = pd.DataFrame({"item_id": ["i3", "i1", "i2", "i4"], "title": ["C", "A", "B", "D"]})
    users = pd.DataFrame({"user_id": ["u2", "u1"], "age": [30, 20]})
    return Dataset(name="tiny", interactions=_inter(rows), items=items, users=users)


def test_user_attributes_returns_plain_python_values() -> None:
    users = pd.DataFrame({"age": pd.array([30, None], dtype="Int64"), "zip": ["1", None], "other": [1, 2]})
    attrs = user_attributes(users)
    assert attrs == [{"age": 30, "zip": "1"}, {}]
    assert type(attrs[0]["age"]) is int


def test_split_request_carries_id_attributes_and_history() -> None:
    split = make_split(_tiny_dataset(), k_core=1)
    req = split.request(1, split.history(1, "test"), k=5, request_id="r1")
    assert (req.user_id, req.user_idx, req.k, req.request_id) == ("u1", 1, 5, "r1")
    assert dict(req.user_attrs) == {"age": 20} and type(req.user_attrs["age"]) is int
    assert req.history.tolist() == [1, 0] and req.exclude is None
    assert dict(split.request(2, np.zeros(0, np.int64)).user_attrs) == {}  # u3 has no users row: age unknown


def test_make_split_by_hand() -> None:
    split = make_split(_tiny_dataset(), k_core=1)
    # items in items-table order, i4 never interacted; users in users-table order, then u3
    assert split.vocab.item_ids.tolist() == ["i3", "i1", "i2"]
    assert split.vocab.user_ids.tolist() == ["u2", "u1", "u3"]
    assert split.items["title"].tolist() == ["C", "A", "B"]
    assert split.users["age"].tolist()[:2] == [30, 20] and pd.isna(split.users["age"].iloc[2])
    assert split.users["attributes"].tolist() == ["{}", "{}", "{}"]
    # u2: i3(t5,row3) i1(t5,row4) i2(t7); u1: i1 i3 i2; u3: i2 i3 i1(t4, the kept duplicate)
    assert [s.tolist() for s in split.train_sequences] == [[0], [1], [2]]
    assert split.valid.tolist() == [1, 0, 0]
    assert split.test.tolist() == [2, 2, 1]
    assert split.valid_ts.tolist() == [5, 20, 3] and split.test_ts.tolist() == [7, 30, 4]
    p = split.protocol
    assert (p["k_core"], p["split"], p["ranking"], p["exclude"]) == (1, "leave-one-out", "full", "history")
    assert (p["min_user_interactions"], p["n_users_dropped_short"], p["n_interactions"]) == (3, 1, 9)


def test_make_split_ties_keep_input_row_order() -> None:
    split = make_split(_tiny_dataset(swap_tied_rows=True), k_core=1)
    # now i1 precedes i3 in the input at the same timestamp, so i1 is u2's train item
    assert split.train_sequences[0].tolist() == [1]
    assert split.valid[0] == 0


def test_make_split_rejects_items_missing_from_catalog() -> None:
    ds = _tiny_dataset()
    ds.items = ds.items[ds.items["item_id"] != "i2"].reset_index(drop=True)
    with pytest.raises(DataError, match=r"missing from the items table.*i2"):
        make_split(ds, k_core=1)


def _random_dataset(seed: int = 3) -> Dataset:
    rng = np.random.default_rng(seed)
    n = 600
    inter = pd.DataFrame({
        "user_id": rng.integers(0, 40, n).astype(str), "item_id": rng.integers(0, 60, n).astype(str),
        "rating": rng.integers(1, 6, n).astype(float), "timestamp": rng.integers(0, 50, n),
    })
    items = pd.DataFrame({"item_id": np.arange(60).astype(str)})
    users = pd.DataFrame({"user_id": np.arange(40).astype(str)})
    return Dataset(name="random", interactions=inter, items=items, users=users)


def test_make_split_invariants_and_round_trip(tmp_path) -> None:
    split = make_split(_random_dataset(), k_core=3)
    train = split.train
    n_users = split.n_users
    assert len(train) + 2 * n_users == split.protocol["n_interactions"]
    assert np.all(np.diff(train["user_idx"].to_numpy()) >= 0)
    per_user = np.bincount(train["user_idx"], minlength=n_users) + 2
    per_item = np.bincount(train["item_idx"], minlength=split.n_items)
    per_item += np.bincount(split.valid, minlength=split.n_items) + np.bincount(split.test, minlength=split.n_items)
    assert per_user.min() >= 3 and per_item.min() >= 3
    for u, seq in enumerate(split.train_sequences):
        ts = train.loc[train["user_idx"] == u, "timestamp"].to_numpy()
        assert np.all(np.diff(ts) >= 0)
        assert ts.max() <= split.valid_ts[u] <= split.test_ts[u]
        assert split.valid[u] not in seq and split.test[u] not in seq
        assert split.valid[u] != split.test[u]
    split.save(tmp_path / "split")
    loaded = Split.load(tmp_path / "split")
    assert loaded.protocol == split.protocol
    np.testing.assert_array_equal(loaded.test, split.test)
    assert loaded.vocab.user_ids.tolist() == split.vocab.user_ids.tolist()


@pytest.mark.ml100k
def test_ml100k_five_core_counts(ml100k_dir) -> None:
    from offline.loaders import load_dataset

    split = make_split(load_dataset(ml100k_dir), k_core=5)
    assert (split.n_users, split.n_items) == (943, 1349)
    assert len(split.train) + 2 * 943 == split.protocol["n_interactions"] == 99287


def test_users_outside_the_k_core_are_kept_for_serving_with_their_history(tmp_path) -> None:
    base = _tiny_dataset()
    users = pd.concat([base.users, pd.DataFrame({"user_id": ["u9", "u4"], "age": [54, 41]})], ignore_index=True)
    split = make_split(Dataset(name="tiny", interactions=base.interactions, items=base.items, users=users), k_core=1)
    assert "u4" not in split.vocab.user_ids.tolist()  # two events: not evaluated ...
    out = split.outside
    assert out["user_id"].tolist() == ["u9", "u4"]  # ... but known: listed order, then the log's
    assert [h.tolist() for h in out["history"]] == [[], [1, 2]]  # i1 then i2, as catalog indices
    assert user_attributes(out) == [{"age": 54}, {"age": 41}]
    assert (split.protocol["n_users_outside"], split.protocol["n_items_outside"]) == (2, 1)  # u9 u4; i4 unseen
    split.save(tmp_path / "split")
    loaded = Split.load(tmp_path / "split").outside
    assert loaded["user_id"].tolist() == ["u9", "u4"] and [h.tolist() for h in loaded["history"]] == [[], [1, 2]]


def test_outside_users_match_a_split_saved_in_another_spelling() -> None:
    ds = Dataset(name="d", interactions=pd.DataFrame({"user_id": ["a", "b", "b"], "item_id": ["caf\u00e9", "caf\u00e9", "x"],
                                                      "rating": 1.0, "timestamp": [1, 1, 2]}),
                 items=pd.DataFrame({"item_id": ["caf\u00e9", "x"]}), users=pd.DataFrame({"user_id": ["a", "b"]}))
    out = outside_users(ds, pd.Series(["a"]), pd.Series(["cafe\u0301", "x"]))  # an old split's NFD catalog
    assert [h.tolist() for h in out["history"]] == [[0, 1]]


def test_a_listed_catalog_adds_items_no_event_names_after_the_kept_ones(tmp_path) -> None:
    base = _tiny_dataset()
    items = pd.concat([base.items, pd.DataFrame({"item_id": ["i9"], "title": ["Rare"]})], ignore_index=True)
    inter = pd.concat([base.interactions, _inter([("u4", "i9", 3)])], ignore_index=True)  # i9: one event
    ds = Dataset(name="tiny", interactions=inter, items=items, users=base.users)
    kept = make_split(ds, k_core=2)
    listed = make_split(ds, k_core=2, catalog="listed")
    assert kept.items["item_id"].tolist() == ["i3", "i1", "i2"]
    # i4 (no event) comes after them; i9 (an event the k-core removed, with u4) stays out
    assert listed.items["item_id"].tolist() == ["i3", "i1", "i2", "i4"]
    assert listed.items.loc[3, "title"] == "D"
    pd.testing.assert_frame_equal(listed.train, kept.train)
    np.testing.assert_array_equal(listed.test, kept.test)
    assert "catalog" not in kept.protocol  # the default leaves a split's record (and id) as it was
    assert (listed.protocol["catalog"], listed.protocol["n_items_without_events"]) == ("listed", 1)
    assert (listed.protocol["n_items"], listed.protocol["n_items_outside"]) == (4, 1)
    listed.save(tmp_path / "split")
    assert Split.load(tmp_path / "split").items["item_id"].tolist() == ["i3", "i1", "i2", "i4"]
    with pytest.raises(ValueError, match="catalog must be one of interacted, listed, got 'all'"):
        make_split(ds, catalog="all")
