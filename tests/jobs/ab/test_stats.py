"""The closed-form tests against hand-worked values and scipy references."""

from __future__ import annotations

import math

import pytest
from scipy import stats as sps

from jobs.ab.stats import (
    diff_interval,
    relative_lift,
    srm_check,
    two_proportion_ztest,
    wilson_interval,
    z_two_sided,
)


def test_two_sided_z() -> None:
    assert z_two_sided(0.05) == pytest.approx(1.959964, abs=1e-6)
    assert z_two_sided(0.001) == pytest.approx(3.290527, abs=1e-6)
    with pytest.raises(ValueError, match="alpha must be in"):
        z_two_sided(1.0)


def test_ztest_hand_worked() -> None:
    # 100/1000 vs 130/1000: pooled p = 0.115, se = sqrt(0.115 * 0.885 * (2 / 1000)) = 0.0142671
    # z = 0.03 / 0.0142671 = 2.10274; p = 2 * (1 - Phi(2.10274)) = 0.03549
    z, p = two_proportion_ztest(100, 1000, 130, 1000)
    assert z == pytest.approx(0.03 / math.sqrt(0.115 * 0.885 * 0.002), rel=1e-12)
    assert z == pytest.approx(2.10274, abs=1e-5)
    assert p == pytest.approx(2 * sps.norm.sf(z), rel=1e-12)
    assert p == pytest.approx(0.03549, abs=1e-5)
    z2, p2 = two_proportion_ztest(130, 1000, 100, 1000)
    assert (z2, p2) == pytest.approx((-z, p))
    assert two_proportion_ztest(0, 10, 0, 20) == (0.0, 1.0)


def test_wilson_hand_values() -> None:
    # 10/100, z = 1.959964: centre (0.1 + z^2/200) / (1 + z^2/100) = 0.11483,
    # half-width z * sqrt(0.0009 + z^2/40000) / (1 + z^2/100) = 0.05960
    lo, hi = wilson_interval(10, 100)
    assert lo == pytest.approx(0.05523, abs=1e-5)
    assert hi == pytest.approx(0.17437, abs=1e-5)
    lo0, hi0 = wilson_interval(0, 50)  # never collapses to a point at 0, unlike the Wald interval
    assert lo0 == pytest.approx(0.0, abs=1e-12)
    assert hi0 == pytest.approx(1.959964**2 / (50 + 1.959964**2), abs=1e-6)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="successes=5, n=3"):
        wilson_interval(5, 3)


def test_diff_interval_is_newcombes_hybrid_score_interval() -> None:
    # Newcombe (Stat. Med. 1998) table II, method 10: 56/70 - 48/80 -> [0.0524, 0.3339]
    assert diff_interval(48, 80, 56, 70) == pytest.approx((0.0524, 0.3339), abs=5e-5)
    # by hand from the two Wilson intervals: d -/+ hypot of the distances to their bounds
    la, ua = wilson_interval(100, 1000)
    lb, ub = wilson_interval(130, 1000)
    lo, hi = diff_interval(100, 1000, 130, 1000)
    assert (lo, hi) == pytest.approx((0.03 - math.hypot(0.13 - lb, ua - 0.1), 0.03 + math.hypot(ub - 0.13, 0.1 - la)))
    assert relative_lift(0.1, 0.13) == pytest.approx(0.3)
    assert relative_lift(0.0, 0.1) is None


@pytest.mark.parametrize(("x_a", "n_a", "x_b", "n_b"), [(0, 10, 3, 10), (1, 1, 0, 1), (0, 1, 1, 1), (0, 5, 0, 5)])
def test_diff_interval_agrees_with_the_test_on_small_arms(x_a: int, n_a: int, x_b: int, n_b: int) -> None:
    # the unpooled Wald interval gave 0/10 vs 3/10 [+0.016, +0.584] beside p = 0.060, and
    # 1/1 vs 0/1 the zero-width [-1, -1] beside p = 0.157
    _, p = two_proportion_ztest(x_a, n_a, x_b, n_b)
    lo, hi = diff_interval(x_a, n_a, x_b, n_b)
    assert p > 0.05 and lo < 0 < hi
    assert hi - lo > 0.1


def test_srm_fires_on_a_skewed_split_and_not_on_a_fair_one() -> None:
    fair = srm_check({"control": 5030, "treatment": 4970}, {"control": 0.5, "treatment": 0.5})
    assert fair["chi2"] == pytest.approx(2 * 30**2 / 5000)  # 0.36
    assert fair["p_value"] == pytest.approx(sps.chi2.sf(0.36, 1))
    assert not fair["mismatch"]
    skewed = srm_check({"control": 5300, "treatment": 4700}, {"control": 0.5, "treatment": 0.5})
    assert skewed["chi2"] == pytest.approx(36.0)
    assert skewed["p_value"] < 1e-8 and skewed["mismatch"]
    three = srm_check({"holdout": 100, "a": 450, "b": 450}, {"holdout": 0.1, "a": 0.45, "b": 0.45})
    assert three["chi2"] == 0.0 and three["df"] == 2 and not three["mismatch"]
    stray = srm_check({"a": 10, "b": 10, "x": 1}, {"a": 0.5, "b": 0.5})
    assert stray["mismatch"] and stray["unexpected_arms"] == ["x"]


@pytest.mark.parametrize(("shares", "match"), [
    ({"control": math.nan, "treatment": 0.5}, "finite and >= 0"),  # was: expected all NaN, p = 1, no mismatch
    ({"control": math.inf, "treatment": 1.0}, "finite and >= 0"),
    ({"control": -0.5, "treatment": 1.5}, "finite and >= 0"),
    ({"control": 0.0, "treatment": 0.0}, "positive, finite sum"),
    ({"control": 1e308, "treatment": 1e308}, "positive, finite sum"),  # the sum overflows to inf
    ({}, "positive, finite sum"),
])
def test_srm_refuses_shares_it_cannot_test(shares: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        srm_check({"control": 50, "treatment": 50}, shares)


def test_srm_expected_counts_do_not_overflow_on_large_shares() -> None:
    big = srm_check({"control": 6, "treatment": 4}, {"control": 1e308, "treatment": 1e308 / 2})  # n * share: inf
    assert big["expected"] == pytest.approx({"control": 20 / 3, "treatment": 10 / 3})
    assert math.isfinite(big["chi2"]) and not big["mismatch"]  # type: ignore[arg-type]


def test_srm_flags_users_in_an_arm_configured_with_share_zero() -> None:
    # a switched-off arm that still receives users is a broken assignment, not a fair split
    out = srm_check({"control": 500, "treatment": 498, "off": 3}, {"control": 0.5, "treatment": 0.5, "off": 0.0})
    assert out["mismatch"] and out["unexpected_arms"] == ["off"]
    quiet = srm_check({"control": 500, "treatment": 498, "off": 0}, {"control": 0.5, "treatment": 0.5, "off": 0.0})
    assert not quiet["mismatch"]
