"""The rule set file format: declarative compliance rules, validated at load with named errors.

A rule set is a YAML mapping ``{version: str, description: str, rules: [rule, ...]}``; every
rule has an ``id`` (unique) and a ``kind``:

- ``blocklist``: items matched by ``items`` (external ids, categories, audiences, a minimum
  risk level, LLM tags) are never served; with ``when_user`` only to users matching it;
- ``audience_gate``: users younger than ``min_age`` never see items whose audience is
  ``audience`` or more restricted (``offline.schema.AUDIENCES`` order: all < teen < adult);
- ``risk_tolerance``: a user never sees an item whose ``risk_level`` exceeds the user's
  ``risk_tolerance`` (``default_tolerance`` for users without one);
- ``category_cap``: at most ``max_items`` items per category (one ``category`` or, when
  omitted, every category) in the list, keeping the best-ranked ones;
- ``disclaimer``: attach ``text`` to the items matched by ``items``.

``when_user_unknown`` says what a rule does when the user attribute its condition needs is
missing: ``restrict`` (the default, fail closed: an unknown age counts as under ``min_age``)
or ``allow`` (the condition counts as not met). Item-side gaps always fail closed
(``rules.engine``).

Errors raise ``RulesError`` naming the rule and the key, e.g.
``rule 'adult_gate' (rules[1]): min_age must be an integer``. Deliberately left out: evaluation
(``rules.engine``) and item attribute arrays (``rules.items``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from offline.schema import RISK_LEVELS


class RulesError(ValueError):
    """A rule set file or rule is invalid; the message names the file, the rule and the key."""


UnknownUser = Literal["restrict", "allow"]


class ItemSelector(BaseModel):
    """Which items a rule targets: an item matches when it matches any listed selector."""

    model_config = ConfigDict(extra="forbid")

    item_ids: list[str] = Field(default_factory=list, description="External item ids.")
    categories: list[str] = Field(default_factory=list, description="Items having any of these categories.")
    audiences: list[Literal["all", "teen", "adult"]] = Field(default_factory=list)
    min_risk_level: int | None = Field(default=None, ge=min(RISK_LEVELS), le=max(RISK_LEVELS))
    tags: list[str] = Field(default_factory=list, description="Tags in the item's attributes JSON ('tags').")

    @model_validator(mode="after")
    def _not_empty(self) -> ItemSelector:
        if not (self.item_ids or self.categories or self.audiences or self.tags) and self.min_risk_level is None:
            raise ValueError("selects nothing: give item_ids, categories, audiences, min_risk_level or tags")
        return self


class UserCondition(BaseModel):
    """Which users a rule applies to; every given check must hold (AND)."""

    model_config = ConfigDict(extra="forbid")

    age_below: int | None = Field(default=None, ge=0)
    age_at_least: int | None = Field(default=None, ge=0)
    occupations: list[str] | None = None
    genders: list[str] | None = None


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    description: str = ""


class BlocklistRule(_Rule):
    kind: Literal["blocklist"]
    items: ItemSelector
    when_user: UserCondition | None = None
    when_user_unknown: UnknownUser = "restrict"


class AudienceGateRule(_Rule):
    kind: Literal["audience_gate"]
    audience: Literal["teen", "adult"]
    min_age: int = Field(ge=0, le=150)
    when_user_unknown: UnknownUser = "restrict"


class RiskToleranceRule(_Rule):
    kind: Literal["risk_tolerance"]
    default_tolerance: int = Field(default=0, ge=min(RISK_LEVELS), le=max(RISK_LEVELS))


class CategoryCapRule(_Rule):
    kind: Literal["category_cap"]
    max_items: int = Field(ge=0)
    category: str | None = Field(default=None, description="The capped category; None caps every category.")


class DisclaimerRule(_Rule):
    kind: Literal["disclaimer"]
    text: str = Field(min_length=1)
    items: ItemSelector


Rule = BlocklistRule | AudienceGateRule | RiskToleranceRule | CategoryCapRule | DisclaimerRule
RULE_KINDS: dict[str, type[_Rule]] = {
    "blocklist": BlocklistRule,
    "audience_gate": AudienceGateRule,
    "risk_tolerance": RiskToleranceRule,
    "category_cap": CategoryCapRule,
    "disclaimer": DisclaimerRule,
}


class RuleSet(BaseModel):
    """A validated rule set; build it with ``parse_ruleset`` or ``load_ruleset``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str = Field(min_length=1)
    description: str = ""
    rules: tuple[Rule, ...] = ()


_FRIENDLY = {
    "int_parsing": "must be an integer",
    "int_type": "must be an integer",
    "int_from_float": "must be an integer",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "missing": "is required",
    "extra_forbidden": "is not a known key",
}


def parse_ruleset(data: Any, source: str = "rule set") -> RuleSet:
    """Validate a YAML-shaped mapping into a ``RuleSet``; ``RulesError`` names rule and key."""
    if not isinstance(data, dict):
        raise RulesError(f"{source}: top level must be a mapping with 'version' and 'rules'")
    unknown = sorted(set(data) - {"version", "description", "rules"})
    if unknown:
        raise RulesError(f"{source}: unknown top-level key(s) {unknown}")
    version = data.get("version")
    if not isinstance(version, str | int | float) or str(version) == "":
        raise RulesError(f"{source}: 'version' is required and must be a non-empty string")
    raw_rules = data.get("rules") or []
    if not isinstance(raw_rules, list):
        raise RulesError(f"{source}: 'rules' must be a list")
    rules = [_parse_rule(raw, i, source) for i, raw in enumerate(raw_rules)]
    seen: set[str] = set()
    for i, rule in enumerate(rules):
        if rule.id in seen:
            raise RulesError(f"{source}: rule {rule.id!r} (rules[{i}]): duplicate id")
        seen.add(rule.id)
    return RuleSet(version=str(version), description=str(data.get("description", "")), rules=tuple(rules))


def load_ruleset(path: Path | str) -> RuleSet:
    path = Path(path)
    if not path.exists():
        raise RulesError(f"{path}: rule set file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise RulesError(f"{path}: not valid YAML: {exc}") from exc
    return parse_ruleset(data, source=str(path))


def _parse_rule(raw: Any, index: int, source: str) -> Rule:
    if not isinstance(raw, dict):
        raise RulesError(f"{source}: rules[{index}] must be a mapping, got {type(raw).__name__}")
    rule_id = raw.get("id")
    where = f"{source}: rule {rule_id!r} (rules[{index}])" if rule_id else f"{source}: rules[{index}]"
    kind = raw.get("kind")
    if kind not in RULE_KINDS:
        raise RulesError(f"{where}: unknown kind {kind!r}; known kinds: {sorted(RULE_KINDS)}")
    try:
        return RULE_KINDS[kind].model_validate(raw)  # type: ignore[return-value]
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"]) or "(rule)"
            friendly = _FRIENDLY.get(err["type"])
            problems.append(f"{key} {friendly}" if friendly else f"{key}: {err['msg'].removeprefix('Value error, ')}")
        raise RulesError(f"{where}: " + "; ".join(problems)) from exc
