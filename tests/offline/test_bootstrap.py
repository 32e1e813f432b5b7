"""Paired bootstrap: degenerate cases by hand and a plain numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

import offline.bootstrap as bootstrap
from offline.bootstrap import paired_bootstrap


def test_identical_rankers_have_zero_difference() -> None:
    a = np.random.default_rng(1).random(200)
    r = paired_bootstrap(a, a.copy(), n_boot=500)
    assert r["mean"] == 0.0 and r["ci95"] == [0.0, 0.0] and r["p_value"] == 1.0
    assert (r["n_users"], r["n_boot"]) == (200, 500)


def test_constant_shift_gives_a_point_interval() -> None:
    a = np.random.default_rng(2).random(300)
    r = paired_bootstrap(a, a + 0.1, n_boot=300)
    assert r["mean"] == pytest.approx(0.1)
    assert r["ci95"] == pytest.approx([0.1, 0.1])
    assert r["p_value"] == 0.0
    assert paired_bootstrap(a + 0.1, a, n_boot=300)["mean"] == pytest.approx(-0.1)  # b - a


def test_matches_plain_numpy_reference_across_chunks(monkeypatch) -> None:
    rng = np.random.default_rng(7)
    a, b = rng.random(25), rng.random(25) + 0.05
    n_boot, seed = 400, 11
    idx = np.random.default_rng(seed).integers(0, 25, size=(n_boot, 25))
    means = (b - a)[idx].mean(axis=1)
    lo, hi = np.quantile(means, [0.025, 0.975])
    side = means <= 0 if (b - a).mean() > 0 else means >= 0
    monkeypatch.setattr(bootstrap, "_MAX_CHUNK_ELEMENTS", 25 * 7)  # 7 resamples per chunk
    r = paired_bootstrap(a, b, n_boot=n_boot, seed=seed)
    assert r["ci95"] == pytest.approx([lo, hi], abs=1e-12)
    assert r["p_value"] == pytest.approx(min(1.0, 2 * side.mean()))
    assert r["mean"] == pytest.approx((b - a).mean())


def test_significant_difference_and_bad_input() -> None:
    rng = np.random.default_rng(3)
    a = rng.random(1000)
    r = paired_bootstrap(a, a + rng.normal(0.05, 0.1, 1000), n_boot=1000)
    assert r["ci95"][0] > 0 and r["p_value"] < 0.01
    with pytest.raises(ValueError, match="equal length"):
        paired_bootstrap(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="alpha"):
        paired_bootstrap(np.zeros(3), np.zeros(3), alpha=1.5)


@pytest.mark.parametrize("n", [0, 1])
def test_fewer_than_two_users_are_refused_by_name(n: int) -> None:
    """One user resamples to the same mean every time: there is no interval. scipy's own refusal
    ("each sample in `data` must contain two or more observations") named neither users nor the bootstrap."""
    with pytest.raises(ValueError, match=f"paired_bootstrap: a confidence interval needs at least 2 users, got {n}$"):
        paired_bootstrap(np.zeros(n), np.ones(n))
