"""Closed-form statistics of online A/B tests on proportions (CTR, conversion).

- ``wilson_interval``: the Wilson score interval (Wilson, 1927), sound near 0 and 1 where
  the normal (Wald) interval collapses; CTRs of a few percent are exactly there.
- ``two_proportion_ztest``: pooled two-sided z-test of p_b = p_a; ``diff_interval`` the
  interval of p_b - p_a by Newcombe's hybrid score method (Newcombe 1998, method 10), built
  from the two Wilson intervals: unlike the unpooled Wald interval it never collapses to a
  point at 0 or 1 and agrees with the test on small arms (0/10 vs 3/10: Wald excludes 0 while
  the test gives p = 0.06; Newcombe includes 0).
- ``srm_check``: sample-ratio mismatch, a chi-square goodness-of-fit test of the observed
  users per arm against the configured split (Fabijan et al., KDD 2019). A tiny p-value
  (below 0.001 by convention) means the assignment or logging is broken and no other
  number of the experiment can be trusted.

Distributions come from scipy (``scipy.stats.norm``, ``binomtest(...).proportion_ci`` for
Wilson, ``chisquare`` for the SRM test), imported inside the functions: ``scipy.stats`` costs
~0.3 s to import and the serving app imports this package's experiment assignment.

Deliberately left out: sequential testing, variance reduction (CUPED), and clustered
(delta-method) variances for per-impression CTR: impressions of one user are treated as
independent, which understates the CTR interval when users see many lists.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

SRM_ALPHA = 0.001


def z_two_sided(alpha: float) -> float:
    """z with P(|Z| > z) = alpha (1.959964 for alpha = 0.05)."""
    from scipy.stats import norm  # lazy: heavy (scipy), see the module doc

    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    return float(norm.isf(alpha / 2))


def _check_counts(successes: int, n: int) -> None:
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")


def wilson_interval(successes: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Wilson score interval of a proportion; (0, 1) when ``n`` is 0.

    >>> [round(x, 4) for x in wilson_interval(10, 100)]
    [0.0552, 0.1744]
    """
    from scipy.stats import binomtest  # lazy: heavy (scipy), see the module doc

    _check_counts(successes, n)
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if n == 0:
        return 0.0, 1.0
    ci = binomtest(successes, n).proportion_ci(confidence_level=1 - alpha, method="wilson")
    return max(0.0, float(ci.low)), min(1.0, float(ci.high))


def two_proportion_ztest(x_a: int, n_a: int, x_b: int, n_b: int) -> tuple[float, float]:
    """(z, two-sided p) of H0: p_a = p_b with the pooled standard error; z > 0 when b is higher.

    >>> z, p = two_proportion_ztest(100, 1000, 130, 1000)
    >>> round(z, 4), round(p, 4)
    (2.1027, 0.0355)
    """
    _check_counts(x_a, n_a)
    _check_counts(x_b, n_b)
    if n_a == 0 or n_b == 0:
        raise ValueError(f"two_proportion_ztest: both arms need observations, got n_a={n_a}, n_b={n_b}")
    pooled = (x_a + x_b) / (n_a + n_b)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    diff = x_b / n_b - x_a / n_a
    if se == 0:  # both arms all-0 or all-1: no evidence of a difference
        return 0.0, 1.0
    from scipy.stats import norm  # lazy: heavy (scipy), see the module doc

    z = diff / se
    return z, min(1.0, float(2 * norm.sf(abs(z))))


def diff_interval(x_a: int, n_a: int, x_b: int, n_b: int, alpha: float = 0.05) -> tuple[float, float]:
    """Newcombe's hybrid score interval of p_b - p_a (Newcombe, Stat. Med. 1998, method 10).

    With (l_a, u_a), (l_b, u_b) the Wilson intervals of the two arms and d = p_b - p_a:
    [d - sqrt((p_b - l_b)^2 + (u_a - p_a)^2), d + sqrt((u_b - p_b)^2 + (p_a - l_a)^2)].
    Newcombe's worked example, 56/70 vs 48/80 (difference of the first minus the second):

    >>> [round(x, 4) for x in diff_interval(48, 80, 56, 70)]
    [0.0524, 0.3339]
    """
    _check_counts(x_a, n_a)
    _check_counts(x_b, n_b)
    if n_a == 0 or n_b == 0:
        raise ValueError(f"diff_interval: both arms need observations, got n_a={n_a}, n_b={n_b}")
    pa, pb = x_a / n_a, x_b / n_b
    la, ua = wilson_interval(x_a, n_a, alpha)
    lb, ub = wilson_interval(x_b, n_b, alpha)
    d = pb - pa
    return d - math.hypot(pb - lb, ua - pa), d + math.hypot(ub - pb, pa - la)


def relative_lift(p_a: float, p_b: float) -> float | None:
    """(p_b - p_a) / p_a, None when the control rate is 0."""
    return None if p_a == 0 else (p_b - p_a) / p_a


def check_shares(shares: Mapping[str, float], what: str) -> None:
    """Refuse shares the SRM check cannot use: any NaN, infinite or negative share, or none positive.

    A NaN share would turn every expected count into NaN and the test into a silent pass.
    """
    bad = {arm: s for arm, s in shares.items() if not math.isfinite(s) or s < 0}
    if bad:
        raise ValueError(f"{what}: shares must be finite and >= 0, got {bad} in {dict(shares)}")
    total = sum(shares.values())
    if not shares or not 0 < total < math.inf:
        raise ValueError(f"{what}: shares need a positive, finite sum, got {dict(shares)}")


def srm_check(observed: Mapping[str, int], expected_shares: Mapping[str, float],
              alpha: float = SRM_ALPHA) -> dict[str, object]:
    """Chi-square goodness of fit of users per arm against the configured shares.

    Arms observed but not configured, or configured with share 0, count as mismatch (no user
    should be there: their expected count is 0); shares
    are renormalised to sum 1 and must be finite and >= 0 (``check_shares``, else ValueError).
    Returns ``{"chi2", "df", "p_value", "mismatch", "observed", "expected"}``; ``mismatch`` is
    True when p < ``alpha``.
    """
    check_shares(expected_shares, "srm_check")
    unknown = sorted(arm for arm, users in observed.items() if users > 0 and expected_shares.get(arm, 0) == 0)
    total_share = sum(expected_shares.values())
    n = sum(observed.values())
    if n == 0:
        raise ValueError("srm_check: no users observed")
    from scipy.stats import chisquare  # lazy: heavy (scipy), see the module doc

    expected = {arm: n * (s / total_share) for arm, s in expected_shares.items()}
    arms = [arm for arm, e in expected.items() if e > 0]
    if len(arms) > 1:
        test = chisquare([observed.get(arm, 0) for arm in arms], [expected[arm] for arm in arms],
                         sum_check=False)  # users of unconfigured arms are left out of both sides
        chi2, p = float(test.statistic), float(test.pvalue)
    else:
        chi2, p = 0.0, 1.0
    df = max(1, len(arms) - 1)
    p = 0.0 if unknown else p
    return {"chi2": chi2, "df": df, "p_value": p, "mismatch": bool(unknown) or p < alpha,
            "observed": {arm: int(observed.get(arm, 0)) for arm in [*expected, *unknown]},
            "expected": expected, "unexpected_arms": unknown, "alpha": alpha}
