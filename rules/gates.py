"""Gates a rule set enforces, and the ones a new rule set would drop.

A gate is a rule that keeps items away from users: an ``audience_gate`` (age), the
``risk_tolerance`` rule, a ``blocklist``. Replacing the active rule set with one that lacks a
gate the active one enforces switches that protection off for everyone, so a publish (``PUT
/admin/rules``) or a rollback that does so is refused, naming the gates, unless the document
lists them in ``acknowledge_dropped_gates`` (a rollback may list them in its request too).

Gate names, as an acknowledgement spells them:

- ``audience_gate:<audience>`` (``teen`` or ``adult``): kept when the new set has an audience
  gate on that audience or a less restricted one (a ``teen`` gate also hides adult items) with
  at least the same ``min_age``, and, when the old one restricted users of unknown age, one
  that still does;
- ``risk_tolerance``: kept when the new set has a risk rule whose ``default_tolerance`` is no
  higher;
- ``blocklist:<rule id>``: kept when the new set has a blocklist with that id that blocks at least
  the same items from at least the same users (a narrower ``when_user`` or a shorter list drops it).

Compared are the rules *in force on the catalog* (``rules.attribute_coverage.resolve``): a gate skipped
here (no item carries an audience) protects nothing, so dropping it is no change, and a gate
the new set still names but that would be skipped here counts as dropped.

>>> from rules.schema import parse_ruleset
>>> old = parse_ruleset({"version": "a", "rules": [
...     {"id": "adult", "kind": "audience_gate", "audience": "adult", "min_age": 18}]})
>>> new = parse_ruleset({"version": "b", "rules": [
...     {"id": "adult", "kind": "audience_gate", "audience": "adult", "min_age": 16}]})
>>> [g.name for g in dropped_gates(old, new)]
['audience_gate:adult']

Deliberately left out: how the rules judge items (``rules.engine``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from offline.schema import AUDIENCES
from rules.schema import AudienceGateRule, BlocklistRule, RiskToleranceRule, Rule, RulesError, RuleSet


class Gate(NamedTuple):
    name: str  # e.g. "audience_gate:adult"
    rule: Rule  # the rule of the old set enforcing it


class GatesDropped(RulesError):
    """A rule set would drop gates the active one enforces, without acknowledging them."""


def gate_name(rule: Rule) -> str | None:
    """The gate ``rule`` enforces (module doc), or None for a rule that gates nothing (caps, disclaimers)."""
    if isinstance(rule, AudienceGateRule):
        return f"audience_gate:{rule.audience}"
    if isinstance(rule, RiskToleranceRule):
        return "risk_tolerance"
    if isinstance(rule, BlocklistRule):
        return f"blocklist:{rule.id}"
    return None


def _covers(new: Rule, old: Rule) -> bool:
    """Whether ``new`` keeps at least what ``old`` keeps away (module doc)."""
    if isinstance(old, AudienceGateRule) and isinstance(new, AudienceGateRule):
        return (AUDIENCES.index(new.audience) <= AUDIENCES.index(old.audience) and new.min_age >= old.min_age
                and (old.when_user_unknown == "allow" or new.when_user_unknown == "restrict"))
    if isinstance(old, RiskToleranceRule) and isinstance(new, RiskToleranceRule):
        return new.default_tolerance <= old.default_tolerance
    if isinstance(old, BlocklistRule) and isinstance(new, BlocklistRule):
        return new.id == old.id and _blocks_at_least(new, old)
    return False


def _blocks_at_least(new: BlocklistRule, old: BlocklistRule) -> bool:
    """Whether blocklist ``new`` keeps away every item ``old`` does, from every user ``old`` does: each of
    its selector lists holds at least ``old``'s, its risk floor is no higher, and it asks no more of the
    user (no condition, or ``old``'s own, and unknown users still restricted when ``old`` restricted them)."""
    a, b = new.items, old.items
    lists = all(set(getattr(b, f)) <= set(getattr(a, f)) for f in ("item_ids", "categories", "audiences", "tags"))
    risk = b.min_risk_level is None or (a.min_risk_level is not None and a.min_risk_level <= b.min_risk_level)
    users = new.when_user is None or new.when_user == old.when_user
    unknown = old.when_user_unknown == "allow" or new.when_user_unknown == "restrict" or new.when_user is None
    return lists and risk and users and unknown


def dropped_gates(before: RuleSet, after: RuleSet) -> list[Gate]:
    """The gates ``before`` enforces that no rule of ``after`` keeps, in ``before``'s order."""
    out: list[Gate] = []
    for rule in before.rules:
        name = gate_name(rule)
        if name is not None and not any(_covers(new, rule) for new in after.rules) and name not in {g.name for g in out}:
            out.append(Gate(name, rule))
    return out


def check_dropped(before: RuleSet, after: RuleSet, acknowledged: Iterable[str] = (), source: str = "rule set") -> None:
    """``GatesDropped`` naming every gate ``after`` drops that is not in ``acknowledged``."""
    ack = set(acknowledged)
    missing = [g for g in dropped_gates(before, after) if g.name not in ack]
    if not missing:
        return
    named = "; ".join(f"{g.name} (rule {g.rule.id!r} of {before.version!r})" for g in missing)
    listed = ", ".join(f'"{g.name}"' for g in missing)
    raise GatesDropped(
        f"{source}: version {after.version!r} drops gate(s) the active rule set enforces: {named}. Every user "
        f"would then see what they keep away. If that is meant, add acknowledge_dropped_gates: [{listed}] "
        "to the document")
