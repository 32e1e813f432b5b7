"""Paired bootstrap confidence intervals for the difference between two rankers.

Both rankers are scored on the same users (per-user NDCG@10, say, from
``offline.metrics.per_user_metrics``); we resample *users* with replacement and recompute the
mean difference, which keeps the pairing and so cancels per-user difficulty (Efron &
Tibshirani, 1993; the paired test of Sakai, 2006 for IR evaluation). The difference is
always ``b - a`` ("b vs a"): a positive mean says b is better.

The resampling is ``scipy.stats.bootstrap`` (percentile method, in batches that bound memory).

Deliberately left out: multiple-comparison corrections and the BCa interval (the percentile
interval is what recommender papers report); sequential A/B testing lives with the A/B code.
"""

from __future__ import annotations

import numpy as np

_MAX_CHUNK_ELEMENTS = 4_000_000  # resample-index matrix chunk: 32 MB of int64
MIN_USERS = 2  # resampling one user gives one mean every time: no interval (scipy refuses it too, less plainly)


def paired_bootstrap(
    a: np.ndarray, b: np.ndarray, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05
) -> dict:
    """Bootstrap the mean of ``b - a`` over users.

    Returns ``{"mean", "ci95": [lo, hi], "p_value", "n_users", "n_boot", "alpha"}``:
    ``mean`` is the observed mean difference, ``ci95`` the percentile interval at level
    ``1 - alpha`` (named for the default alpha), ``p_value`` two-sided: twice the share of
    bootstrap means on the other side of 0 from ``mean`` (0 included), capped at 1 (1 when
    ``mean`` is 0). The resampling is ``scipy.stats.bootstrap`` seeded with ``default_rng(seed)``.

    >>> r = paired_bootstrap(np.zeros(4), np.full(4, 0.5), n_boot=10)
    >>> r["mean"], r["ci95"], r["p_value"]
    (0.5, [0.5, 0.5], 0.0)
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"paired_bootstrap: a and b must be 1-D of equal length, got {a.shape} and {b.shape}")
    if len(a) < MIN_USERS:
        raise ValueError(f"paired_bootstrap: a confidence interval needs at least {MIN_USERS} users, got {len(a)}")
    if n_boot < 1:
        raise ValueError(f"paired_bootstrap: n_boot must be >= 1, got {n_boot}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"paired_bootstrap: alpha must be in (0, 1), got {alpha}")
    from scipy.stats import bootstrap  # lazy: scipy.stats costs ~0.3 s to import

    diff = b - a
    n = len(diff)
    res = bootstrap((diff,), np.mean, n_resamples=n_boot, batch=max(1, _MAX_CHUNK_ELEMENTS // n),
                    method="percentile", confidence_level=1 - alpha, vectorized=True,
                    rng=np.random.default_rng(seed))
    means = res.bootstrap_distribution
    observed = float(diff.mean())
    lo, hi = res.confidence_interval.low, res.confidence_interval.high
    if observed > 0:
        p = 2.0 * float(np.mean(means <= 0))
    elif observed < 0:
        p = 2.0 * float(np.mean(means >= 0))
    else:
        p = 1.0
    return {"mean": observed, "ci95": [float(lo), float(hi)], "p_value": min(p, 1.0),
            "n_users": n, "n_boot": n_boot, "alpha": alpha}
