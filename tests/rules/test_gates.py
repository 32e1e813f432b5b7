"""Gates a new rule set drops (rules.gates), blocklist ids the catalog lacks, names a rule cannot match."""

from __future__ import annotations

import pandas as pd
import pytest

from rules.attribute_coverage import CatalogAttributes, resolve
from rules.gates import GatesDropped, check_dropped, dropped_gates
from rules.schema import RulesError, parse_ruleset
from tests.rules.conftest import toy_items_table

ADULT_18 = {"id": "adult_gate", "kind": "audience_gate", "audience": "adult", "min_age": 18}
RISK_1 = {"id": "risk", "kind": "risk_tolerance", "default_tolerance": 1}
WITHDRAWN = {"id": "withdrawn", "kind": "blocklist", "items": {"item_ids": ["a"]}}


def rs(version: str, *rules: dict, **top: object):
    return parse_ruleset({"version": version, "rules": list(rules), **top})


def names(before, after) -> list[str]:
    return [g.name for g in dropped_gates(before, after)]


def test_a_one_rule_set_that_matches_nothing_drops_every_gate_it_replaces() -> None:
    before = rs("default", WITHDRAWN, ADULT_18, RISK_1)
    after = rs("oops", {"id": "x", "kind": "blocklist", "items": {"item_ids": ["no-such-item"]}})
    assert names(before, after) == ["blocklist:withdrawn", "audience_gate:adult", "risk_tolerance"]
    with pytest.raises(GatesDropped) as err:
        check_dropped(before, after, source="PUT /admin/rules")
    assert str(err.value).startswith(
        "PUT /admin/rules: version 'oops' drops gate(s) the active rule set enforces: blocklist:withdrawn "
        "(rule 'withdrawn' of 'default'); audience_gate:adult (rule 'adult_gate' of 'default'); risk_tolerance")
    assert 'acknowledge_dropped_gates: ["blocklist:withdrawn", "audience_gate:adult", "risk_tolerance"]' in str(
        err.value)
    check_dropped(before, after, ["blocklist:withdrawn", "audience_gate:adult", "risk_tolerance"])  # acknowledged
    with pytest.raises(GatesDropped, match="risk_tolerance") as partly:
        check_dropped(before, after, ["blocklist:withdrawn", "audience_gate:adult"])
    assert "audience_gate:adult (" not in str(partly.value)  # only what is not acknowledged is named


@pytest.mark.parametrize(("after", "dropped"), [
    ({**ADULT_18, "min_age": 16}, ["audience_gate:adult"]),  # weaker: younger users see adult items
    ({**ADULT_18, "min_age": 21}, []),  # stricter keeps it
    ({**ADULT_18, "audience": "teen"}, []),  # a teen gate at 18 also hides adult items
    ({**ADULT_18, "id": "renamed"}, []),  # the rule id does not matter, what it keeps away does
    ({**ADULT_18, "when_user_unknown": "allow"}, ["audience_gate:adult"]),  # unknown ages now let through
])
def test_an_audience_gate_is_kept_only_by_one_at_least_as_strict(after: dict, dropped: list[str]) -> None:
    assert names(rs("a", ADULT_18), rs("b", after)) == dropped


def test_risk_and_blocklist_gates() -> None:
    assert names(rs("a", RISK_1), rs("b", {**RISK_1, "default_tolerance": 2})) == ["risk_tolerance"]
    assert names(rs("a", RISK_1), rs("b", {**RISK_1, "default_tolerance": 0})) == []
    assert names(rs("a", WITHDRAWN), rs("b", {**WITHDRAWN, "items": {"item_ids": ["a", "b"]}})) == []  # more blocked
    # a blocklist kept by id but blocking less, or from fewer users, switches part of the gate off
    assert names(rs("a", WITHDRAWN), rs("b", {**WITHDRAWN, "items": {"item_ids": ["b"]}})) == ["blocklist:withdrawn"]
    assert names(rs("a", WITHDRAWN), rs("b", {**WITHDRAWN, "when_user": {"age_at_least": 500}})) == [
        "blocklist:withdrawn"]
    minors = {**WITHDRAWN, "when_user": {"age_below": 18}}
    assert names(rs("a", minors), rs("b", WITHDRAWN)) == []  # from everyone now: broader
    assert names(rs("a", minors), rs("b", {**minors, "when_user_unknown": "allow"})) == ["blocklist:withdrawn"]
    cap = {"id": "cap", "kind": "category_cap", "max_items": 1}
    assert names(rs("a", cap, ADULT_18), rs("b", ADULT_18)) == []  # a cap gates nothing


def test_gates_compare_what_is_in_force_on_the_catalog() -> None:
    """A gate skipped here protects nothing (no change when dropped); one the new set names but that
    would be skipped here is dropped."""
    no_audience = CatalogAttributes.of(
        pd.DataFrame({"item_id": ["a"], "categories": [["Drama"]], "audience": [None], "risk_level": [1]}), None)
    skipped_gate = {**ADULT_18, "on_absent_attribute": "skip"}
    before = resolve(rs("a", skipped_gate, RISK_1), no_audience).ruleset
    assert names(before, resolve(rs("b", RISK_1), no_audience).ruleset) == []
    full = CatalogAttributes.of(toy_items_table(), pd.DataFrame({"user_id": ["u"], "age": [30]}))
    with_gate = resolve(rs("a", ADULT_18), full).ruleset
    assert names(with_gate, resolve(rs("b", skipped_gate, RISK_1), no_audience).ruleset) == ["audience_gate:adult"]


@pytest.mark.parametrize(("ack", "says"), [
    ("audience_gate:adult", "'acknowledge_dropped_gates' must be a list of gate names"),
    (["age_gate:adult"], "acknowledge_dropped_gates: 'age_gate:adult' is not a gate name"),
    (["blocklist: x"], "acknowledge_dropped_gates: 'blocklist: x' is not a gate name"),
])
def test_an_acknowledgement_names_gates_as_they_are_spelt(ack: object, says: str) -> None:
    with pytest.raises(RulesError, match=says):
        rs("a", ADULT_18, acknowledge_dropped_gates=ack)
    assert rs("a", ADULT_18, acknowledge_dropped_gates=["blocklist:x", "risk_tolerance"]).acknowledge_dropped_gates == (
        "blocklist:x", "risk_tolerance")


def test_blocklist_ids_the_catalog_lacks_are_refused_with_close_matches() -> None:
    items = pd.DataFrame({"item_id": ["I377", "I378", "m1"], "categories": [[], [], []], "audience": [None] * 3,
                          "risk_level": [None] * 3})
    carried = CatalogAttributes.of(items, None)
    for typo, hint in (("I0377", "(did you mean 'I377'"), ("i377", "(did you mean 'I377'")):
        blocklist = {"id": "takedown", "kind": "blocklist", "items": {"item_ids": [typo]}}
        with pytest.raises(RulesError) as err:
            resolve(rs("a", blocklist), carried)
        assert f"rule 'takedown' (rules[0]): no item has id {typo!r} {hint}" in str(err.value)
        assert "unknown_ids: allow" in str(err.value)
        allowed = {**blocklist, "items": {"item_ids": [typo], "unknown_ids": "allow"}}
        assert resolve(rs("a", allowed), carried).skipped == {}  # an id that may come later, said so
    note = {"id": "n", "kind": "disclaimer", "text": "t", "items": {"item_ids": ["zzz"]}}
    with pytest.raises(RulesError, match="no item has id 'zzz' in this catalog"):
        resolve(rs("a", note), carried)
    resolve(rs("a", {"id": "ok", "kind": "blocklist", "items": {"item_ids": ["m1"]}}), carried)


@pytest.mark.parametrize("name", ["Hor\x00ror", "Horror\n", "Dra\u200bma", "Hor\u2028ror"])
def test_category_and_tag_names_with_control_or_invisible_characters_are_refused(name: str) -> None:
    for rule in ({"id": "n", "kind": "disclaimer", "text": "t", "items": {"categories": [name]}},
                 {"id": "n", "kind": "blocklist", "items": {"tags": [name]}},
                 {"id": "n", "kind": "category_cap", "max_items": 1, "category": name}):
        with pytest.raises(RulesError, match=r"rule 'n' \(rules\[0\]\): .*name .* contains an? (control|invisible|line break)"):
            rs("a", rule)
