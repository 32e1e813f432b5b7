"""Coarse training on a local Ray cluster: the same query groups and feature rows as in-process, and a
data-parallel LightGBM fit that learns what the in-process fit learns."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from coarse_rank.cluster_training import features_on_cluster, group_shards, groups_on_cluster
from coarse_rank.dataset import build_groups
from coarse_rank.features import FeatureBuilder
from coarse_rank.train import train_coarse
from recsys.cluster import ClusterConfig
from tests.coarse_rank.conftest import TOY_CONFIG
from tests.coarse_rank.toy import PopularityStage
from tests.heavy import HEAVY

ray = pytest.importorskip("ray")
LOCAL = ClusterConfig(address="local", num_workers=2)


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_groups_and_features_equal_the_in_process_ones(chain, local_ray) -> None:
    stage = PopularityStage(chain, depth=12)
    users = np.array([5, 0, 77, 31, 150, 9, 64])
    here = build_groups(chain, stage, "train", users=users, progress=False, positions=2)
    there = groups_on_cluster(chain, stage, "train", LOCAL, users=users, positions=2, progress=False)
    np.testing.assert_array_equal(there.labels, here.labels)
    assert [r.request_id for r in there.requests] == [r.request_id for r in here.requests]
    for a, b in zip(there.candidates, here.candidates, strict=True):
        np.testing.assert_array_equal(a.items, b.items)
        np.testing.assert_array_equal(a.score("recall"), b.score("recall"))
    builder = FeatureBuilder(TOY_CONFIG).fit(chain)
    want = np.vstack([builder.transform(r, c) for r, c in zip(here.requests, here.candidates, strict=True)])
    np.testing.assert_array_equal(features_on_cluster(builder, there, LOCAL, progress=False), want)


@pytest.mark.slow
@HEAVY
def test_data_parallel_fit_learns_the_next_item(chain, trained, local_ray, tmp_path) -> None:
    _, single = trained
    one_fit = TOY_CONFIG.model_copy(update={"cold_item_dropout": 0.0, "young_item_copies": 0.0})  # one Ray Train run, not one per variant
    report = train_coarse(chain, PopularityStage(chain), tmp_path / "coarse", one_fit, seed=7, progress=False,
                          cluster=LOCAL)
    assert report["engine"] == "ray (2 workers)" and report["n_train_groups"] == single["n_train_groups"]
    assert report["valid_ndcg@10_coarse"] > report["valid_ndcg@10_recall"] + 0.3  # as the in-process fit
    assert abs(report["valid_ndcg@10_coarse"] - single["valid_ndcg@10_coarse"]) < 0.05
    assert report["user_sample"]["train"] == "all 160 users (coarse.max_train_users not reached)"
    assert (tmp_path / "coarse" / "model.txt").exists() and (tmp_path / "coarse" / "meta.json").exists()


def test_shards_hold_whole_groups() -> None:
    sizes = np.array([3, 8, 1, 1, 6, 2])
    shards = group_shards(sizes, 3)
    assert shards[0][0] == 0 and shards[-1][1] == len(sizes)
    assert all(a < b for a, b in shards) and all(shards[i][1] == shards[i + 1][0] for i in range(2))
    with pytest.raises(ValueError, match="cannot feed"):
        group_shards(np.array([4]), 2)
