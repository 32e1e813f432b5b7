"""Analysis of an online experiment's event log: per-variant CTR and conversion, tests, SRM.

Per arm (the ``variant`` recorded on each event; events without one are counted and left out):

- CTR = clicks / impressions, with its Wilson 95% interval; only the clicks of users exposed
  in that arm count (a click without an impression of its user in its arm, from an impression
  logger down, a bot or a client naming another arm, would otherwise read as a lift): they are
  counted as ``clicks_without_impression`` and warned about. An arm whose counted clicks
  exceed its impressions has no CTR (not a proportion; warned about, never clamped);
- conversion = users with >= 1 click / users exposed (>= 1 impression), Wilson interval;
  a click by a user never exposed in that arm is not a conversion;
- against the control (the configured first variant, else the first arm by name): the
  difference with its normal interval, the pooled two-proportion z-test and the relative lift;
- the sample-ratio check (``jobs.ab.stats.srm_check``) of exposed users per arm against the
  configured shares, when they are known; ``warnings`` says when it fires, and users seen in
  two arms (broken stickiness) are counted.

The holdout is reported like an arm and counts in the SRM check but is never the control.

Deliberately left out: reading the log (``jobs.ab.events``) and writing reports.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from jobs.ab.stats import diff_interval, relative_lift, srm_check, two_proportion_ztest, wilson_interval
from recsys.experiments import HOLDOUT


def _rate(x: int, n: int) -> dict[str, Any]:
    if x > n:  # clicks above impressions: no proportion, no interval
        return {"rate": None, "ci95": None}
    lo, hi = wilson_interval(x, n)
    return {"rate": round(x / n, 6) if n else None, "ci95": [round(lo, 6), round(hi, 6)]}


def arm_counts(events: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Impressions, clicks (of exposed users), clicks without impression, exposed and converted users per variant."""
    out = {}
    for arm, ev in events.groupby("variant", sort=True):
        imp, clk = ev[ev["type"] == "impression"], ev[ev["type"] == "click"]
        exposed = set(imp["user_id"])
        matched = clk["user_id"].isin(exposed)
        converted = set(clk[matched]["user_id"])
        n_imp, n_clk = len(imp), int(matched.sum())
        out[str(arm)] = {"impressions": n_imp, "clicks": n_clk, "clicks_without_impression": int((~matched).sum()),
                         "users_exposed": len(exposed), "users_converted": len(converted),
                         "ctr": _rate(n_clk, n_imp), "conversion": _rate(len(converted), len(exposed))}
    return out


def _compare(c: Mapping[str, Any], t: Mapping[str, Any], x: str, n: str) -> dict[str, Any] | None:
    xa, na, xb, nb = int(c[x]), int(c[n]), int(t[x]), int(t[n])
    if na == 0 or nb == 0 or xa > na or xb > nb:  # no rate in one arm (see ``_rate``): nothing to compare
        return None
    z, p = two_proportion_ztest(xa, na, xb, nb)
    lo, hi = diff_interval(xa, na, xb, nb)
    lift = relative_lift(xa / na, xb / nb)
    return {"diff": round(xb / nb - xa / na, 6), "ci95": [round(lo, 6), round(hi, 6)], "z": round(z, 4),
            "p_value": round(p, 6), "relative_lift": None if lift is None else round(lift, 5)}


def _count_warnings(arms: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What the per-arm counts leave out of CTR: clicks of unexposed users, clicks above impressions."""
    out = []
    orphans = {a: v["clicks_without_impression"] for a, v in arms.items() if v["clicks_without_impression"]}
    if orphans:
        out.append(f"click(s) by users with no impression in their arm, left out of CTR and conversion: {orphans} "
                   "(an impression logger down, bots, or clients naming another arm)")
    over = {a: f"{v['clicks']} clicks / {v['impressions']} impressions" for a, v in arms.items()
            if v["clicks"] > v["impressions"]}
    if over:
        out.append(f"more clicks than impressions in {over}: CTR is not a proportion there and is left undefined")
    return out


def analyze_events(
    events: pd.DataFrame, expected_shares: Mapping[str, float] | None = None, control: str | None = None,
) -> dict[str, Any]:
    """The analysis report of ``events`` (columns ``type``, ``user_id``, ``variant``)."""
    missing = {"type", "user_id", "variant"} - set(events.columns)
    if missing:
        raise ValueError(f"analyze_events: events lack column(s) {sorted(missing)}")
    tagged = events[events["variant"].notna()]
    arms = arm_counts(tagged)
    if not arms:
        raise ValueError(f"analyze_events: none of the {len(events)} events carries a variant")
    if control is None:
        configured = [a for a in (expected_shares or {}) if a != HOLDOUT and a in arms]
        control = configured[0] if configured else next((a for a in arms if a != HOLDOUT), None)
        if control is None:
            raise ValueError(f"analyze_events: no arm other than the holdout ({HOLDOUT!r}) has events; "
                             "nothing to compare")
    if control not in arms:
        raise ValueError(f"analyze_events: control {control!r} has no events; arms seen: {sorted(arms)}")
    comparisons = {}
    for arm in arms:
        if arm in (control, HOLDOUT):
            continue
        comparisons[arm] = {"ctr": _compare(arms[control], arms[arm], "clicks", "impressions"),
                            "conversion": _compare(arms[control], arms[arm], "users_converted", "users_exposed")}
    exposed = tagged[tagged["type"] == "impression"].groupby("user_id")["variant"].nunique()
    report: dict[str, Any] = {
        "n_events": len(events), "events_without_variant": int(len(events) - len(tagged)),
        "experiments": sorted(str(e) for e in tagged["experiment"].dropna().unique()) if "experiment" in tagged else [],
        "control": control, "arms": arms, "comparisons": comparisons,
        "users_in_multiple_arms": int((exposed > 1).sum()), "srm": None, "warnings": _count_warnings(arms),
    }
    if expected_shares:
        observed = {a: v["users_exposed"] for a, v in arms.items() if v["users_exposed"] > 0}
        srm = srm_check(observed, expected_shares)
        report["srm"] = srm
        if srm["mismatch"]:
            report["warnings"].append(
                f"sample ratio mismatch: users per arm {srm['observed']} vs configured shares "
                f"{dict(expected_shares)} (chi2={srm['chi2']:.2f}, p={srm['p_value']:.2g} < {srm['alpha']}); "
                "assignment or logging is broken, do not trust the other numbers")
    if report["users_in_multiple_arms"]:
        report["warnings"].append(f"{report['users_in_multiple_arms']} user(s) were exposed in more than one arm")
    return report
