"""Evaluates a rule set on one user and an ordered candidate list, failing closed.

``apply_rules`` is the pure core the rules stage and the offline evaluator share. Evaluation
order: every filtering rule (blocklist, audience_gate, risk_tolerance, and the fail-closed
part of disclaimer) in file order, then the category caps in file order on the survivors
(a cap counts only items actually served, so it runs last), then disclaimers are attached to
what is left. An item's removal reason is the first rule that removed it.

Fail closed, always:
- an item index outside the catalog is removed (reason ``unknown_item``);
- an item whose attribute a rule needs is missing (audience/risk level NA, malformed tags) is
  removed by that rule -- but only when the rule applies to this user (an adult is not gated
  by the adult gate, so an unknown audience does not matter for them);
- a rule that raises (e.g. ``age: "twelve"`` cannot be read as an integer) removes every
  remaining candidate, with reason ``"<rule id> (evaluation failed: ...)"``;
- a missing user attribute follows the rule's ``when_user_unknown`` (default ``restrict``:
  an unknown age counts as under the gate's ``min_age``); a missing ``risk_tolerance`` uses
  the rule's ``default_tolerance``.

Filters are numpy over the candidate arrays; only the cap walks the list, because whether an
item fits depends on which earlier items were kept (greedy, best-ranked first).

Deliberately left out: reading files (``rules.schema``), the pipeline stage (``rules.stage``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

import numpy as np
import pandas as pd

from offline.schema import AUDIENCES
from recsys.names import canonical
from rules.items import UNKNOWN, ItemAttributes
from rules.schema import (
    AudienceGateRule,
    BlocklistRule,
    CategoryCapRule,
    DisclaimerRule,
    ItemSelector,
    RiskToleranceRule,
    Rule,
    RuleSet,
    UserCondition,
)

log = logging.getLogger(__name__)
UNKNOWN_ITEM = "unknown_item"


class RulesOutcome(NamedTuple):
    keep: np.ndarray  # [n] bool, aligned with the input item indices
    removed: list[tuple[int, str]]  # (item_idx, rule id) for each removed item, in input order
    disclaimers: dict[int, list[str]]  # item_idx -> disclaimer texts, kept items only


def apply_rules(
    ruleset: RuleSet, user_attrs: Mapping[str, Any], items: ItemAttributes, item_indices: np.ndarray,
    apply: Literal["all", "filters", "caps"] = "all",
) -> RulesOutcome:
    """Which of ``item_indices`` (best-ranked first) may be served to this user, and why not.

    ``apply`` selects the rule families: ``"filters"`` (every rule but caps, plus
    disclaimers), ``"caps"`` (category caps only, on the order given: run it after fusion so
    the cap counts the served order), or ``"all"``.

    >>> from rules.schema import parse_ruleset
    >>> import pandas as pd
    >>> table = ItemAttributes.from_items(pd.DataFrame({"item_id": ["a", "b"], "categories": [[], []],
    ...     "audience": ["all", "adult"], "risk_level": [0, 0]}))
    >>> rs = parse_ruleset({"version": "1", "rules": [{"id": "adult", "kind": "audience_gate",
    ...     "audience": "adult", "min_age": 18}]})
    >>> apply_rules(rs, {"age": 15}, table, np.array([1, 0])).removed
    [(1, 'adult')]
    """
    idx = np.asarray(item_indices, dtype=np.int64)
    reason = np.full(len(idx), "", dtype=object)
    valid = (idx >= 0) & (idx < len(items))
    reason[~valid] = UNKNOWN_ITEM
    safe = np.where(valid, idx, 0)
    to_attach: list[tuple[np.ndarray, str]] = []
    for rule in ruleset.rules:
        if isinstance(rule, CategoryCapRule) or apply == "caps":
            continue
        try:
            block, attach = _evaluate(rule, user_attrs, items, safe)
        except Exception as exc:  # any failure removes everything the rule was meant to judge
            log.warning("rule %r failed, removing all candidates: %r", rule.id, exc)
            _mark(reason, np.ones(len(idx), dtype=bool), f"{rule.id} (evaluation failed: {exc})")
            continue
        _mark(reason, block, rule.id)
        if attach is not None:
            to_attach.append((attach, rule.text))  # type: ignore[union-attr]
    for rule in ruleset.rules:
        if isinstance(rule, CategoryCapRule) and apply != "filters":
            alive = np.flatnonzero(reason == "")
            try:
                over = category_cap_overflow(rule, items, safe[alive])
                _mark(reason, _scatter(len(idx), alive[over]), rule.id)
            except Exception as exc:
                log.warning("cap %r failed, removing all candidates: %r", rule.id, exc)
                _mark(reason, np.ones(len(idx), dtype=bool), f"{rule.id} (evaluation failed: {exc})")
    keep = reason == ""
    removed = [(int(idx[i]), str(reason[i])) for i in np.flatnonzero(~keep)]
    disclaimers: dict[int, list[str]] = {}
    for mask, text in to_attach:
        for i in np.flatnonzero(mask & keep):
            texts = disclaimers.setdefault(int(idx[i]), [])
            if text not in texts:
                texts.append(text)
    return RulesOutcome(keep=keep, removed=removed, disclaimers=disclaimers)


def category_cap_overflow(rule: CategoryCapRule, items: ItemAttributes, idx: np.ndarray) -> np.ndarray:
    """Bool mask of the items in ``idx`` (best first) beyond ``max_items`` for some capped category."""
    if rule.category is None:
        cols = np.arange(len(items.category_names))
    else:
        cols = items.category_columns([rule.category])
    member = items.categories[np.ix_(idx, cols)]
    counts = np.zeros(len(cols), dtype=np.int64)
    over = np.zeros(len(idx), dtype=bool)
    for i, row in enumerate(member):
        if (counts[row] >= rule.max_items).any():
            over[i] = True  # a dropped item does not use up the cap, so later items may still fit
        else:
            counts[row] += 1
    return over


def _evaluate(
    rule: Rule, user: Mapping[str, Any], items: ItemAttributes, idx: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None]:
    """(block mask, disclaimer attach mask or None) for one filtering rule."""
    none = np.zeros(len(idx), dtype=bool)
    if isinstance(rule, BlocklistRule):
        if not _user_matches(rule.when_user, user, rule.when_user_unknown):
            return none, None
        matched, unknown = _select(rule.items, items, idx)
        return matched | unknown, None
    if isinstance(rule, AudienceGateRule):
        age = user_int(user, "age")
        gated = rule.when_user_unknown == "restrict" if age is None else age < rule.min_age
        if not gated:
            return none, None
        audience = items.audience[idx]
        return (audience == UNKNOWN) | (audience >= AUDIENCES.index(rule.audience)), None
    if isinstance(rule, RiskToleranceRule):
        tolerance = user_int(user, "risk_tolerance")
        tolerance = rule.default_tolerance if tolerance is None else tolerance
        risk = items.risk_level[idx]
        return (risk == UNKNOWN) | (risk > tolerance), None
    if isinstance(rule, DisclaimerRule):
        matched, unknown = _select(rule.items, items, idx)
        return unknown & ~matched, matched  # matched items get the text whatever else is unknown
    raise TypeError(f"rule {rule.id!r}: no evaluator for kind {rule.kind!r}")


def _select(sel: ItemSelector, items: ItemAttributes, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(matched, unknown): matched by any selector; unknown where a needed attribute is missing."""
    matched = np.zeros(len(idx), dtype=bool)
    unknown = np.zeros(len(idx), dtype=bool)
    if sel.item_ids:
        matched |= np.isin(idx, items.indices_of(sel.item_ids))
    if sel.categories:
        matched |= items.categories[np.ix_(idx, items.category_columns(sel.categories))].any(axis=1)
    if sel.audiences:
        audience = items.audience[idx]
        unknown |= audience == UNKNOWN
        matched |= np.isin(audience, [AUDIENCES.index(a) for a in sel.audiences])
    if sel.min_risk_level is not None:
        risk = items.risk_level[idx]
        unknown |= risk == UNKNOWN
        matched |= risk >= sel.min_risk_level
    if sel.tags:
        unknown |= ~items.tags_known[idx]
        matched |= items.tags[np.ix_(idx, items.tag_columns(sel.tags))].any(axis=1)
    return matched, unknown


def _user_matches(cond: UserCondition | None, user: Mapping[str, Any], when_unknown: str) -> bool:
    if cond is None:
        return True
    age = user_int(user, "age") if cond.age_below is not None or cond.age_at_least is not None else None
    checks: list[bool | None] = []
    if cond.age_below is not None:
        checks.append(None if age is None else age < cond.age_below)
    if cond.age_at_least is not None:
        checks.append(None if age is None else age >= cond.age_at_least)
    for key, allowed in (("occupation", cond.occupations), ("gender", cond.genders)):
        if allowed is not None:
            value = user_str(user, key)
            checks.append(None if value is None else canonical(value) in allowed)  # allowed: NFC (rules.schema)
    if False in checks:
        return False
    return when_unknown == "restrict" if None in checks else True


def user_int(user: Mapping[str, Any], key: str) -> int | None:
    """Integer user attribute; None when missing/None/NaN; raises ValueError when unreadable."""
    value = user.get(key)
    if _missing(value):
        return None
    if isinstance(value, bool):
        raise ValueError(f"user attribute {key!r} must be an integer, got {value!r}")
    try:
        as_float = float(value)  # type: ignore[arg-type]  # any non-number raises, as intended
    except (TypeError, ValueError):
        raise ValueError(f"user attribute {key!r} must be an integer, got {value!r}") from None
    if not as_float.is_integer():
        raise ValueError(f"user attribute {key!r} must be an integer, got {value!r}")
    return int(as_float)


def user_str(user: Mapping[str, Any], key: str) -> str | None:
    value = user.get(key)
    return None if _missing(value) else str(value)


def _missing(value: object) -> bool:
    return value is None or value is pd.NA or isinstance(value, float | np.floating) and math.isnan(value)


def _mark(reason: np.ndarray, block: np.ndarray, rule_id: str) -> None:
    """Record ``rule_id`` for blocked items that no earlier rule removed."""
    reason[block & (reason == "")] = rule_id


def _scatter(n: int, positions: np.ndarray) -> np.ndarray:
    mask = np.zeros(n, dtype=bool)
    mask[positions] = True
    return mask
