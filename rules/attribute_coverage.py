"""Which attributes a catalog carries, and which rules of a rule set can judge it.

A rule that reads an attribute no item (or no user) of the catalog carries cannot judge
anything: fail closed, it would remove every item for every user (an audience gate on a
catalog without audience ratings), or silently do nothing (a category blocklist on a catalog
without categories). Such a rule set is refused -- at start-up and at ``PUT /admin/rules`` --
with an error naming the rule and the attribute, unless the rule says how to treat that
attribute's absence (``on_absent_attribute`` in ``rules.schema``):

- ``refuse`` (the default): refuse the rule set;
- ``skip``: the rule is off on a catalog where no item carries the attribute (reported as such);
- ``enforce``: the rule applies as written: audience and risk rules remove every item lacking
  the attribute (fail closed); category and tag selectors then match nothing.

A category name no item carries (a typo, another case: ``alcohol`` for ``Alcohol``) is treated
the same way, naming the close matches: refused by default, the rule off under ``skip`` when
none of its categories exist.

An item id no item carries (``I0377`` for ``I377``, another case) is refused the same way,
naming the close matches, whatever ``on_absent_attribute`` says, unless its selector says
``unknown_ids: allow``: a blocklist of ids the catalog lacks blocks nothing.

User attributes are different: a rule never turns off because users lack one, since that
would serve gated items to everybody. A rule reading a user attribute no user carries must
state how to treat an unknown user (``when_user_unknown`` or ``default_tolerance`` written out)
or say ``skip``/``enforce``; either way it then applies as written, with its unknown-user
handling (fail closed by default). This is about *catalog-wide* absence only: where the catalog
carries an attribute and one item lacks it, the rule fails closed for that item exactly as
before (``rules.engine``).

>>> import pandas as pd
>>> from rules.schema import parse_ruleset
>>> items = pd.DataFrame({"item_id": ["a"], "categories": [["Drama"]], "audience": [None], "risk_level": [None]})
>>> carried = CatalogAttributes.of(items, pd.DataFrame({"user_id": ["u"], "age": [30]}))
>>> sorted(carried.items), sorted(carried.users)
(['categories'], ['age'])
>>> rs = parse_ruleset({"version": "1", "rules": [{"id": "adult", "kind": "audience_gate", "audience": "adult",
...     "min_age": 18, "on_absent_attribute": "skip"}]})
>>> resolve(rs, carried).skipped
{'adult': 'no item carries audience'}

Deliberately left out: evaluating rules (``rules.engine``) and the file format (``rules.schema``).
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from typing import NamedTuple

import pandas as pd

from recsys.names import canonical
from rules.schema import (
    AudienceGateRule,
    BlocklistRule,
    CategoryCapRule,
    DisclaimerRule,
    ItemSelector,
    RiskToleranceRule,
    Rule,
    RulesError,
    RuleSet,
)

ITEM_ATTRIBUTES = ("audience", "risk_level", "categories", "tags")
USER_ATTRIBUTES = ("age", "gender", "occupation", "risk_tolerance")


@dataclass(frozen=True)
class CatalogAttributes:
    """The item and user attributes carried by at least one item / user of a catalog."""

    items: frozenset[str] = field(default_factory=frozenset)
    users: frozenset[str] = field(default_factory=frozenset)
    categories: frozenset[str] | None = None  # the category names items carry; None = not checked
    item_ids: frozenset[str] | None = None  # the catalog's item ids (NFC); None = not checked

    @classmethod
    def of(cls, items: pd.DataFrame, users: pd.DataFrame | None) -> CatalogAttributes:
        """Scan the canonical items and users tables (``offline.schema``) once, at load."""
        carried_items = {name for name in ("audience", "risk_level")
                         if name in items.columns and items[name].notna().any()}
        names: set[str] = set()
        if "categories" in items.columns:
            for value in items["categories"]:
                if _non_empty(value):
                    names.update(canonical(v) for v in ([value] if isinstance(value, str) else map(str, value)))
        if names:
            carried_items.add("categories")
        if "attributes" in items.columns and any(_has_tags(a) for a in items["attributes"]):
            carried_items.add("tags")
        carried_users = set()
        if users is not None:
            carried_users = {name for name in USER_ATTRIBUTES if name in users.columns and users[name].notna().any()}
        ids = frozenset(canonical(str(i)) for i in items["item_id"]) if "item_id" in items.columns else None
        return cls(items=frozenset(carried_items), users=frozenset(carried_users), categories=frozenset(names),
                   item_ids=ids)

    @classmethod
    def everything(cls) -> CatalogAttributes:
        """A catalog that carries every attribute (rules judged as written)."""
        return cls(items=frozenset(ITEM_ATTRIBUTES), users=frozenset(USER_ATTRIBUTES))


class Resolution(NamedTuple):
    ruleset: RuleSet  # the rules in force: the input minus the skipped ones, same version
    skipped: dict[str, str]  # rule id -> why it is off on this catalog


def item_attributes_read(rule: Rule) -> tuple[str, ...]:
    """The item attributes ``rule`` needs to judge an item."""
    if isinstance(rule, AudienceGateRule):
        return ("audience",)
    if isinstance(rule, RiskToleranceRule):
        return ("risk_level",)
    if isinstance(rule, CategoryCapRule):
        return ("categories",)
    if isinstance(rule, BlocklistRule | DisclaimerRule):
        return _selector_attributes(rule.items)
    return ()


def user_attributes_read(rule: Rule) -> tuple[str, ...]:
    """The user attributes ``rule`` needs to decide whether it applies to a user."""
    if isinstance(rule, AudienceGateRule):
        return ("age",)
    if isinstance(rule, RiskToleranceRule):
        return ("risk_tolerance",)
    if isinstance(rule, BlocklistRule) and rule.when_user is not None:
        cond = rule.when_user
        needs = []
        if cond.age_below is not None or cond.age_at_least is not None:
            needs.append("age")
        if cond.occupations is not None:
            needs.append("occupation")
        if cond.genders is not None:
            needs.append("gender")
        return tuple(needs)
    return ()


def resolve(ruleset: RuleSet, carried: CatalogAttributes) -> Resolution:
    """The rules of ``ruleset`` in force on a catalog carrying ``carried``; ``RulesError`` when a
    rule reads an absent attribute and does not say how to treat its absence."""
    keep: list[Rule] = []
    skipped: dict[str, str] = {}
    for i, rule in enumerate(ruleset.rules):
        where = f"rule {rule.id!r} (rules[{i}])"
        if unknown_ids := _unknown_item_ids(rule, carried):
            raise RulesError(f"{where}: {'; '.join(unknown_ids)} in this catalog, so the rule would match nothing "
                             "there; fix the id, or set unknown_ids: allow in its items if that is meant")
        users_absent = [] if _states_unknown_user(rule) else [
            f"no user carries {a}" for a in user_attributes_read(rule) if a not in carried.users]
        if users_absent and rule.on_absent_attribute == "refuse":
            raise RulesError(
                f"{where}: {'; '.join(users_absent)} in this catalog; say how to treat such users with "
                "when_user_unknown: restrict (the rule covers them: fail closed) or allow, or remove the rule")
        absent = [f"no item carries {a}" for a in item_attributes_read(rule) if a not in carried.items]
        unknown = [] if absent else _unknown_categories(rule, carried)
        if not absent and not unknown or rule.on_absent_attribute == "enforce":
            keep.append(rule)
        elif rule.on_absent_attribute == "skip":
            if absent or len(unknown) == len(_categories_read(rule)):
                skipped[rule.id] = "; ".join(absent or unknown)
            else:
                keep.append(rule)  # some of its categories exist: those still apply
        else:
            raise RulesError(
                f"{where}: {'; '.join(absent or unknown)} in this catalog, so the rule cannot judge it; "
                "remove the rule, fix the name, or set on_absent_attribute: skip (rule off here) or enforce "
                "(apply as written: audience and risk rules then remove every item lacking the attribute, "
                "category and tag selectors match nothing)")
    return Resolution(ruleset.model_copy(update={"rules": tuple(keep)}), skipped)


def _categories_read(rule: Rule) -> list[str]:
    if isinstance(rule, CategoryCapRule):
        return [rule.category] if rule.category is not None else []
    if isinstance(rule, BlocklistRule | DisclaimerRule):
        return list(rule.items.categories)
    return []


def _unknown_categories(rule: Rule, carried: CatalogAttributes) -> list[str]:
    """``no item carries category 'X' (did you mean 'Y'?)`` for each category name the catalog lacks."""
    if carried.categories is None:
        return []
    out = []
    for name in _categories_read(rule):
        if name not in carried.categories:
            out.append(f"no item carries category {name!r}{_close(name, carried.categories)}")
    return out


def _unknown_item_ids(rule: Rule, carried: CatalogAttributes) -> list[str]:
    """``no item has id 'X' (did you mean 'Y'?)`` for each id of the rule's selector the catalog lacks."""
    if carried.item_ids is None or not isinstance(rule, BlocklistRule | DisclaimerRule):
        return []
    if rule.items.unknown_ids == "allow":
        return []
    return [f"no item has id {name!r}{_close(name, carried.item_ids)}"
            for name in rule.items.item_ids if name not in carried.item_ids]


def _close(name: str, known: frozenset[str]) -> str:
    """`` (did you mean 'A' or 'B'?)``: the closest of ``known`` (same letters in another case first), or ""."""
    same = sorted(k for k in known if k.lower() == name.lower())
    close = same + [c for c in difflib.get_close_matches(name, sorted(known), n=2, cutoff=0.6) if c not in same]
    return f" (did you mean {' or '.join(repr(c) for c in close[:2])}?)" if close else ""


def _states_unknown_user(rule: Rule) -> bool:
    """Whether the rule document writes out how to treat a user lacking the attribute."""
    stated = {"when_user_unknown", "default_tolerance"}
    return bool(stated & rule.model_fields_set)


def _selector_attributes(sel: ItemSelector) -> tuple[str, ...]:
    needs = []
    if sel.categories:
        needs.append("categories")
    if sel.audiences:
        needs.append("audience")
    if sel.min_risk_level is not None:
        needs.append("risk_level")
    if sel.tags:
        needs.append("tags")
    return tuple(needs)  # item_ids need no attribute: ids not in the catalog are ignored


def _non_empty(value: object) -> bool:
    if value is None or isinstance(value, float):
        return False
    return len(value) > 0 if hasattr(value, "__len__") else True


def _has_tags(value: object) -> bool:
    if not isinstance(value, str) or not value:
        return False
    try:
        data = json.loads(value)
    except ValueError:
        return False
    return isinstance(data, dict) and bool(data.get("tags"))
