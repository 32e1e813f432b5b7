"""The recall stage end to end on a tiny trained successor model: exclusions, depth, cold users, reload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recall.config import RecallConfig
from recall.stage import RecallStage
from recall.train import train_two_tower
from recsys.config import StageSpec
from recsys.contract import Candidates, Request, Stage
from tests.recall.two_tower_factories import successor_of, successor_split, tiny_config


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("artifacts")
    split = successor_split()
    split.save(root / "split")
    train_two_tower(split, root / "recall", tiny_config(), progress=False)
    return root


def _stage(artifacts: Path, depth: int = 10, **params) -> RecallStage:
    stage = RecallStage(StageSpec(name="recall", kind="recall", depth=depth, on_error="fail", params=params),
                        RecallConfig())
    stage.load(artifacts)
    return stage


def test_implements_the_stage_contract(artifacts):
    stage = _stage(artifacts)
    assert isinstance(stage, Stage)
    assert (stage.name, stage.writes, stage.reads) == ("recall", ("recall",), ())
    assert len(stage.version()) == 12


def test_ranks_the_successor_first_and_respects_depth(artifacts):
    stage = _stage(artifacts, depth=10, popularity_share=0.2)
    history = np.array([3, 4, 5])
    out = stage.run(Request(user_id="u", history=history, user_attrs={"age": 30}), Candidates.empty())
    assert len(out) == 10
    assert out.items[0] == successor_of(history, stage.n_items) == 6
    assert out.order_by == "recall"
    assert np.all(np.diff(out.scores["recall"]) < 0)
    assert out.flags["src_popularity"].sum() >= 2  # 20% of the depth from the popularity channel
    assert len(np.unique(out.items)) == 10


def test_excluded_items_never_returned(artifacts):
    stage = _stage(artifacts, depth=25)
    exclude = np.array([6, 7, 8, 0, 1])
    out = stage.run(Request(user_id="u", history=np.array([4, 5]), exclude=exclude), Candidates.empty())
    assert not np.isin(out.items, exclude).any()
    assert len(out) == 25  # 30 items minus 5 excluded
    default = stage.run(Request(user_id="u", history=np.array([4, 5])), Candidates.empty())
    assert not np.isin(default.items, [4, 5]).any()  # exclude defaults to the history
    assert default.items[0] == 6


def test_depth_larger_than_catalog_returns_every_allowed_item(artifacts):
    stage = _stage(artifacts, depth=200)
    out = stage.run(Request(user_id="u", history=np.array([1, 2])), Candidates.empty())
    assert sorted(out.items.tolist()) == [i for i in range(30) if i not in (1, 2)]


def test_cold_user_gets_mostly_popularity(artifacts):
    stage = _stage(artifacts, depth=10, cold_popularity_share=0.8)
    out = stage.run(Request(user_id="new"), Candidates.empty())
    assert len(out) == 10
    assert out.flags["src_popularity"].sum() >= 8
    unknown = stage.run(Request(user_id="new", history=np.array([999, -3])), Candidates.empty())
    np.testing.assert_array_equal(unknown.items, out.items)  # unknown items are ignored: still cold


def test_reload_gives_identical_scores_and_batched_vectors_match_run(artifacts):
    a, b = _stage(artifacts), _stage(artifacts)
    hists = [np.array([3, 4, 5]), np.zeros(0, dtype=np.int64), np.array([10, 11])]
    attrs: list[dict[str, Any]] = [{"age": 30, "gender": "F"}, {}, {"occupation": "nurse"}]
    va, vb = a.model.user_vectors(hists, attrs), b.model.user_vectors(hists, attrs)
    np.testing.assert_array_equal(va, vb)
    assert a.version() == b.version()
    single = a.model.user_vectors(hists[:1], attrs[:1])
    np.testing.assert_allclose(single[0], va[0], atol=1e-6)
    req = Request(user_id="u", history=hists[0], user_attrs=attrs[0])
    ra, rb = a.run(req, Candidates.empty()), b.run(req, Candidates.empty())
    np.testing.assert_array_equal(ra.items, rb.items)
    np.testing.assert_array_equal(ra.scores["recall_two_tower"], rb.scores["recall_two_tower"])
    # The two-tower channel's raw score is the cosine of the user and item vectors.
    tt = ~np.isnan(ra.scores["recall_two_tower"])
    np.testing.assert_allclose(ra.scores["recall_two_tower"][tt], (a.model.vectors @ va[0])[ra.items[tt]], atol=1e-5)


def test_with_popularity_changes_only_the_popularity_channel(artifacts):
    stage = _stage(artifacts, depth=10, popularity_share=0.5)
    counts = np.zeros(stage.n_items)
    counts[[29, 27, 25, 23, 21]] = [5, 4, 3, 2, 1]
    other = stage.with_popularity(counts)
    req = Request(user_id="u", history=np.array([3, 4, 5]))
    a, b = stage.run(req, Candidates.empty()), other.run(req, Candidates.empty())
    assert a.items[:5].tolist() == b.items[:5].tolist()  # the two-tower's quota comes first, unchanged
    assert b.items[5:].tolist() == [29, 27, 25, 23, 21] != a.items[5:].tolist()  # then the new counts' order
    assert stage.run(req, Candidates.empty()).items.tolist() == a.items.tolist()  # the original is unchanged
    assert other.version() == stage.version()
    with pytest.raises(ValueError, match="popularity counts 3 items"):
        stage.with_popularity(np.ones(3))
    with pytest.raises(RuntimeError, match="before load"):
        RecallStage(StageSpec(name="recall", kind="recall"), RecallConfig()).with_popularity(counts)


def test_use_before_load_and_missing_artifacts_raise(tmp_path: Path):
    stage = RecallStage(StageSpec(name="recall", kind="recall", on_error="fail"), RecallConfig())
    with pytest.raises(RuntimeError, match="before load"):
        stage.run(Request(user_id="u"), Candidates.empty())
    with pytest.raises(FileNotFoundError, match="no trained recall model"):
        stage.load(tmp_path)
