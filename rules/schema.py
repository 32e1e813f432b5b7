"""The rule set file format: declarative compliance rules, validated at load with named errors.

A rule set is a YAML mapping ``{version: str, description: str, rules: [rule, ...]}`` with at
least one rule (``rules: []`` only together with ``allow_empty: true``: a rule set without
rules turns every compliance rule off); every rule has an ``id`` (unique) and a ``kind``:

- ``blocklist``: items matched by ``items`` (external ids, categories, audiences, a minimum
  risk level, LLM tags) are never served; with ``when_user`` only to users matching it;
- ``audience_gate``: users younger than ``min_age`` never see items whose audience is
  ``audience`` or more restricted (``offline.schema.AUDIENCES`` order: all < teen < adult);
- ``risk_tolerance``: a user never sees an item whose ``risk_level`` exceeds the user's
  ``risk_tolerance`` (``default_tolerance`` for users without one);
- ``category_cap``: at most ``max_items`` items per category (one ``category`` or, when
  omitted, every category) in the list, keeping the best-ranked ones;
- ``disclaimer``: attach ``text`` to the items matched by ``items``.

``item_ids`` of a selector must name items of the catalog (``rules.attribute_coverage``: an unknown id is
refused with the close matches) unless the selector says ``unknown_ids: allow`` (an id that
may appear later, e.g. a withdrawn product). ``acknowledge_dropped_gates`` (top level) lists
the gates this rule set knowingly drops from the one it replaces (``rules.gates``).

``on_absent_attribute`` (every rule) says what happens on a catalog where *no* item or user
carries an attribute the rule reads: ``refuse`` (default), ``skip`` or ``enforce``
(``rules.attribute_coverage``). ``when_user_unknown`` says what a rule does when the user attribute its
condition needs is missing for one user: ``restrict`` (the default, fail closed: an unknown age counts as under ``min_age``)
or ``allow`` (the condition counts as not met). Item-side gaps always fail closed
(``rules.engine``).

Errors raise ``RulesError`` naming the rule and the key, e.g.
``rule 'adult_gate' (rules[1]): min_age must be an integer``. Deliberately left out: evaluation
(``rules.engine``) and item attribute arrays (``rules.items``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from offline.schema import RISK_LEVELS
from recsys.documents import DocumentError, InvalidVersion, check_version, read_document
from recsys.names import WHITESPACE, canonical, forbidden_character, id_problem

# What ``acknowledge_dropped_gates`` may name (``rules.gates``); a blocklist's rule id has no whitespace at its ends
GATE_NAME = re.compile(r"^(audience_gate:(teen|adult)|risk_tolerance|blocklist:\S(.*\S)?)$")


class RulesError(ValueError):
    """A rule set file or rule is invalid; the message names the file, the rule and the key."""


UnknownUser = Literal["restrict", "allow"]


class ItemSelector(BaseModel):
    """Which items a rule targets: an item matches when it matches any listed selector."""

    model_config = ConfigDict(extra="forbid", strict=True)  # "18", yes or true is no age

    item_ids: list[str] = Field(default_factory=list, description="External item ids.")
    categories: list[str] = Field(default_factory=list, description="Items having any of these categories.")
    audiences: list[Literal["all", "teen", "adult"]] = Field(default_factory=list)
    min_risk_level: int | None = Field(default=None, ge=min(RISK_LEVELS), le=max(RISK_LEVELS))
    tags: list[str] = Field(default_factory=list, description="Tags in the item's attributes JSON ('tags').")
    unknown_ids: Literal["refuse", "allow"] = Field(
        default="refuse", description="Whether item_ids the catalog lacks are refused (with close matches) or allowed.")

    @field_validator("item_ids")
    @classmethod
    def _as_the_catalog_spells_them(cls, ids: list[str]) -> list[str]:
        # ids the catalog lacks match nothing, so " x1" or a decomposed "café" would block nothing, and
        # "" or "m\u200b6" could never match: read them as the loaders read a catalog's ids (recsys.names)
        out = [canonical(i.strip(WHITESPACE)) for i in ids]
        for given, name in zip(ids, out, strict=True):
            if problem := id_problem(name):
                raise ValueError(f"item id {given!r} {problem}")
        return out

    @field_validator("categories", "tags")
    @classmethod
    def _names_in_one_spelling(cls, names: list[str]) -> list[str]:
        for name in names:  # a control or invisible character would match no catalog name, silently
            if why := forbidden_character(name):
                raise ValueError(f"name {name!r} contains {why}")
        return [canonical(n) for n in names]  # the catalog scan and the engine compare in NFC

    @model_validator(mode="after")
    def _not_empty(self) -> ItemSelector:
        if not (self.item_ids or self.categories or self.audiences or self.tags) and self.min_risk_level is None:
            raise ValueError("selects nothing: give item_ids, categories, audiences, min_risk_level or tags")
        return self


class UserCondition(BaseModel):
    """Which users a rule applies to; every given check must hold (AND)."""

    model_config = ConfigDict(extra="forbid", strict=True)  # "18", yes or true is no age

    age_below: int | None = Field(default=None, ge=0)
    age_at_least: int | None = Field(default=None, ge=0)
    occupations: list[str] | None = None
    genders: list[str] | None = None

    @field_validator("occupations", "genders")
    @classmethod
    def _in_one_spelling(cls, names: list[str] | None) -> list[str] | None:
        return None if names is None else [canonical(n) for n in names]  # the engine compares in NFC


AbsentAttribute = Literal["refuse", "skip", "enforce"]


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # "18", yes or true is no age

    id: str = Field(min_length=1)
    description: str = ""
    on_absent_attribute: AbsentAttribute = Field(
        default="refuse", description="What to do on a catalog where no item (or no user) carries an attribute "
        "this rule reads (rules.attribute_coverage): refuse the rule set, skip the rule, or enforce it (fail closed).")


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
    max_items: int = Field(ge=0, le=100_000)
    category: str | None = Field(default=None, description="The capped category; None caps every category.")

    @field_validator("category")
    @classmethod
    def _as_the_catalog_spells_it(cls, name: str | None) -> str | None:
        if name is not None and (why := forbidden_character(name)):
            raise ValueError(f"name {name!r} contains {why}")
        return None if name is None else canonical(name)


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
    allow_empty: bool = Field(False, description="Whether `rules` may be empty (every compliance rule off).")
    acknowledge_dropped_gates: tuple[str, ...] = Field(
        (), description="Gates of the replaced rule set this one knowingly drops (rules.gates), e.g. audience_gate:adult.")


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
    """Validate a YAML-shaped mapping into a ``RuleSet``; ``RulesError`` names rule and key.

    Fails closed on the top level too: no ``rules`` key, or an empty list without
    ``allow_empty: true``, is an error (an empty rule set would serve every item to everyone).
    ``version`` must be a string: YAML turns an unquoted ``1.10`` into the number 1.1 and
    ``010`` into 8, so a number is refused rather than published under another name.
    """
    if not isinstance(data, dict):
        raise RulesError(f"{source}: top level must be a mapping with 'version' and 'rules'")
    unknown = sorted(set(data) - set(RuleSet.model_fields), key=str)
    if unknown:
        raise RulesError(f"{source}: unknown top-level key(s) {unknown}")
    version = data.get("version")
    if version is None or version == "":
        raise RulesError(f"{source}: 'version' is required and must be a non-empty string")
    if not isinstance(version, str):
        raise RulesError(f"{source}: 'version' must be a string, got {type(version).__name__} {version!r}: "
                         "YAML reads an unquoted 1.10 as the number 1.1; quote it (version: \"1.10\")")
    try:
        check_version("rules", version)
    except InvalidVersion as exc:
        raise RulesError(f"{source}: {exc}") from None
    description = data.get("description", "")
    if not isinstance(description, str):
        raise RulesError(f"{source}: 'description' must be a string, got {type(description).__name__}")
    allow_empty = data.get("allow_empty", False)
    if not isinstance(allow_empty, bool):
        raise RulesError(f"{source}: 'allow_empty' must be true or false, got {allow_empty!r}")
    if "rules" not in data:
        raise RulesError(f"{source}: 'rules' is required: a rule set without rules turns every compliance "
                         "rule off (write 'rules: []' with 'allow_empty: true' if that is meant)")
    raw_rules = data["rules"]
    if not isinstance(raw_rules, list):
        raise RulesError(f"{source}: 'rules' must be a list")
    if not raw_rules and not allow_empty:
        raise RulesError(f"{source}: 'rules' is empty: every compliance rule would be off "
                         "(add 'allow_empty: true' if that is meant)")
    acknowledged = _acknowledged(data.get("acknowledge_dropped_gates", []), source)
    rules = [_parse_rule(raw, i, source) for i, raw in enumerate(raw_rules)]
    seen: set[str] = set()
    for i, rule in enumerate(rules):
        if rule.id in seen:
            raise RulesError(f"{source}: rule {rule.id!r} (rules[{i}]): duplicate id")
        seen.add(rule.id)
    return RuleSet(version=version, description=description, rules=tuple(rules),
                   allow_empty=allow_empty, acknowledge_dropped_gates=acknowledged)


def _acknowledged(raw: Any, source: str) -> tuple[str, ...]:
    """``acknowledge_dropped_gates``: a list of gate names as ``rules.gates`` spells them."""
    if not isinstance(raw, list) or not all(isinstance(g, str) for g in raw):
        raise RulesError(f"{source}: 'acknowledge_dropped_gates' must be a list of gate names, got {raw!r}")
    for name in raw:
        if not GATE_NAME.match(name):
            raise RulesError(f"{source}: acknowledge_dropped_gates: {name!r} is not a gate name; gates are "
                             "audience_gate:teen, audience_gate:adult, risk_tolerance and blocklist:<rule id>")
    return tuple(raw)


def load_ruleset(path: Path | str) -> RuleSet:
    """The rule set in a YAML/JSON file, read as ``PUT /admin/rules`` reads a document (duplicate
    keys, alias expansion and size bounded: ``recsys.documents``), so a file that serving would
    refuse is refused wherever it is given."""
    try:
        data = read_document(path, "rule set file")
    except DocumentError as exc:
        raise RulesError(str(exc)) from None
    return parse_ruleset(data, source=str(path))


def _parse_rule(raw: Any, index: int, source: str) -> Rule:
    if not isinstance(raw, dict):
        raise RulesError(f"{source}: rules[{index}] must be a mapping, got {type(raw).__name__}")
    rule_id = raw.get("id")
    where = f"{source}: rule {rule_id!r} (rules[{index}])" if rule_id else f"{source}: rules[{index}]"
    kind = raw.get("kind")
    if not isinstance(kind, str):  # a list or mapping is not even hashable for the lookup below
        raise RulesError(f"{where}: kind must be one of {sorted(RULE_KINDS)}, got {type(kind).__name__} {kind!r}")
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
