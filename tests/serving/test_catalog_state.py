from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from serving.catalog_state import CatalogState, SplitHistories


def test_known_user_gets_full_history_attrs_and_index(toy_dir: Path) -> None:
    state = CatalogState.load(toy_dir)
    req = state.request_for("u2", 3, context={"page": "home"}, debug=True, request_id="r1")
    assert req.user_idx == 1
    # train m1, m2 + valid m4 + test m5: serving sees every observed event, oldest first
    assert req.history.tolist() == [0, 1, 3, 4]
    assert dict(req.user_attrs) == {"age": 15, "gender": "F", "occupation": "student"}  # NA zip/risk dropped
    assert (req.k, req.debug, req.request_id, dict(req.context)) == (3, True, "r1", {"page": "home"})
    assert state.request_for("u2", 3, variant="treatment").variant == "treatment"  # the request is built once
    assert req.excluded.tolist() == [0, 1, 3, 4]


def test_a_split_saved_before_ids_were_nfc_answers_requests_in_either_spelling(tmp_path: Path) -> None:
    from offline.protocol import make_split
    from tests.serving.toy import toy_dataset

    ds = toy_dataset()  # a Dataset built in code keeps its ids as given, as the loaders did before NFC
    for frame in (ds.interactions, ds.users):
        frame["user_id"] = frame["user_id"].replace({"u2": "Jose\u0301"})
    for frame in (ds.interactions, ds.items):
        frame["item_id"] = frame["item_id"].replace({"m4": "cafe\u0301"})
    state = CatalogState.from_split(make_split(ds, k_core=1))
    assert state.request_for("Jos\u00e9", 3).user_idx == state.request_for("Jose\u0301", 3).user_idx == 1
    assert state.item_index["caf\u00e9"] == 3


def test_unknown_user_is_cold_start(toy_dir: Path) -> None:
    req = CatalogState.load(toy_dir).request_for("nobody", 5)
    assert req.user_idx is None and req.variant is None
    assert req.history.tolist() == []
    assert dict(req.user_attrs) == {}


def test_item_ids_and_titles_follow_item_index(toy_dir: Path) -> None:
    state = CatalogState.load(toy_dir)
    assert state.n_items == 6
    assert [state.item_id(i) for i in range(6)] == ["m1", "m2", "m3", "m4", "m5", "m6"]
    assert state.title(3) == "Delta"


def test_split_histories_refuses_unknown_index() -> None:
    store = SplitHistories([np.array([1, 2], dtype=np.int64)])
    assert store.history(0).tolist() == [1, 2]
    with pytest.raises(IndexError, match="user_idx 3"):
        store.history(3)


def test_catalog_state_refuses_misaligned_tables() -> None:
    with pytest.raises(ValueError, match="2 user ids but 1 attribute rows"):
        CatalogState(np.array(["a", "b"]), np.array(["x"]), np.array(["X"]), [{}], SplitHistories([]))


def test_a_user_outside_the_k_core_keeps_attributes_and_history() -> None:
    import pandas as pd

    from offline.protocol import make_split
    from tests.serving.toy import toy_dataset

    ds = toy_dataset()
    ds.users = pd.concat([ds.users, pd.DataFrame({"user_id": ["listed-only"], "age": [54]})], ignore_index=True)
    first = ds.interactions.iloc[0]
    ds.interactions = pd.concat([ds.interactions, pd.DataFrame(
        {"user_id": ["short"], "item_id": [first["item_id"]], "rating": [1.0], "timestamp": [first["timestamp"]]})],
        ignore_index=True)
    state = CatalogState.from_split(make_split(ds, k_core=1))
    listed = state.request_for("listed-only", 5)
    assert listed.user_idx is None and dict(listed.user_attrs) == {"age": 54} and listed.history.tolist() == []
    short = state.request_for("short", 5, online_history=np.array([2]))
    item = state.item_index[first["item_id"]]
    assert short.user_idx is None and short.history.tolist() == [item, 2]  # stored, then new events
    assert item in short.excluded.tolist()
    assert dict(state.request_for("nobody", 5).user_attrs) == {}
