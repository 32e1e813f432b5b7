"""The evaluation pass over Ray Data batches answers every user as the single-process pass does."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from bench import engines
from cascade.registry import build_pipeline
from cascade.settings import Settings
from jobs.evaluation.cascade_run import requests_for_user, run_cascade
from jobs.evaluation.cluster_run import per_user_pass, run_cascade_on_cluster
from offline.split import Split

ray = pytest.importorskip("ray")


def unhurried(settings: Settings, address: str | None = None) -> Settings:
    """``bench.engines.unhurried`` (no stage deadline within reach: on a loaded machine a stage past its
    budget falls back, in either pass) with the cluster ``address``."""
    return engines.unhurried(settings).model_copy(update={"ray": settings.ray.model_copy(update={"address": address})})


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_cluster_pass_equals_the_single_process_pass(tiny_cascade, local_ray) -> None:
    art, settings = tiny_cascade
    settings = unhurried(settings)
    split = Split.load(art / "split")
    single = run_cascade(build_pipeline(settings, art), split, "test", progress=False)
    spread = per_user_pass(None, unhurried(settings, "local"), art, split, "test", progress=False)
    for stage, top in single["tops"].items():
        np.testing.assert_array_equal(spread["tops"][stage], top)
    for stage, cands in single["candidates"].items():
        assert len(spread["candidates"][stage]) == len(cands) == split.n_users
        for a, b in zip(spread["candidates"][stage], cands, strict=True):
            np.testing.assert_array_equal(a, b)
    assert spread["status"] == single["status"] and spread["short_reasons"] == single["short_reasons"]
    np.testing.assert_array_equal(spread["served"], single["served"])
    assert len(spread["total_ms"]) == split.n_users
    assert spread["worker_peak_mib"] and all(v > 0 for v in spread["worker_peak_mib"].values())


@pytest.mark.slow
def test_users_in_any_order_keep_their_rows(tiny_cascade, local_ray) -> None:
    art, settings = tiny_cascade
    settings = unhurried(settings)
    split = Split.load(art / "split")
    users = np.random.default_rng(0).permutation(split.n_users)[:20]
    got = run_cascade_on_cluster(settings, art, split, "test", users=users, progress=False)
    want = run_cascade(build_pipeline(settings, art), split, "test", progress=False,
                       requests=[requests_for_user(split, int(u), "test") for u in users])
    np.testing.assert_array_equal(got["tops"]["final"], want["tops"]["final"])
    np.testing.assert_array_equal(got["tops"]["coarse"], want["tops"]["coarse"])


def test_no_users_is_refused() -> None:
    with pytest.raises(ValueError, match="no users"):
        run_cascade_on_cluster(None, None, None, "test", users=np.zeros(0, np.int64), progress=False)  # type: ignore[arg-type]


def test_no_cluster_is_the_single_process_pass(tiny_cascade) -> None:
    art, settings = tiny_cascade
    split = Split.load(art / "split")
    pipeline = build_pipeline(settings, art)
    run = per_user_pass(pipeline, settings, art, split, "test", progress=False)
    assert "worker_peak_mib" not in run and len(run["served"]) == split.n_users
