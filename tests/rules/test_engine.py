"""Rule outcomes on the toy catalog (tests/rules/conftest.py), each worked out by hand."""

import numpy as np
import pytest

from rules.engine import UNKNOWN_ITEM, apply_rules
from rules.items import ItemAttributes
from rules.schema import parse_ruleset
from tests.rules.conftest import toy_items_table

ALL = np.arange(8)
ADULT_GATE = {"id": "adult_gate", "kind": "audience_gate", "audience": "adult", "min_age": 18}
TEEN_GATE = {"id": "teen_gate", "kind": "audience_gate", "audience": "teen", "min_age": 13}
HORROR_NOTE = {"id": "horror_note", "kind": "disclaimer", "text": "scary", "items": {"categories": ["Horror"]}}
RISK_NOTE = {"id": "risk_note", "kind": "disclaimer", "text": "risky", "items": {"min_risk_level": 2}}


def rules(*raw):
    return parse_ruleset({"version": "t1", "rules": list(raw), "allow_empty": not raw})


def kept(ruleset, user, items, order=ALL):
    out = apply_rules(ruleset, user, items, np.asarray(order))
    return np.asarray(order)[out.keep].tolist()


def test_adult_gate_hides_adult_and_unknown_audience_from_minors_only(toy_items):
    rs = rules(ADULT_GATE)
    assert kept(rs, {"age": 15}, toy_items) == [0, 2, 3, 5, 6, 7]  # b is adult, e's audience unknown
    assert kept(rs, {"age": 18}, toy_items) == list(range(8))  # the gate does not concern adults
    assert kept(rs, {"age": np.int64(17)}, toy_items) == [0, 2, 3, 5, 6, 7]


def test_unknown_age_is_restricted_by_default_and_allowed_on_request(toy_items):
    assert kept(rules(ADULT_GATE), {}, toy_items) == [0, 2, 3, 5, 6, 7]
    assert kept(rules(ADULT_GATE), {"age": None}, toy_items) == [0, 2, 3, 5, 6, 7]
    assert kept(rules(ADULT_GATE), {"age": float("nan")}, toy_items) == [0, 2, 3, 5, 6, 7]
    assert kept(rules(ADULT_GATE), {"age": np.float32("nan")}, toy_items) == [0, 2, 3, 5, 6, 7]
    assert kept(rules({**ADULT_GATE, "when_user_unknown": "allow"}), {}, toy_items) == list(range(8))


def test_teen_gate_also_hides_the_more_restricted_adult_audience(toy_items):
    assert kept(rules(TEEN_GATE), {"age": 10}, toy_items) == [0, 3, 5, 6]  # not b (adult), c, h (teen), e
    assert kept(rules(TEEN_GATE), {"age": 13}, toy_items) == list(range(8))


def test_risk_tolerance_hides_riskier_and_unknown_risk_items(toy_items):
    rs = rules({"id": "risk", "kind": "risk_tolerance", "default_tolerance": 0})
    assert kept(rs, {"risk_tolerance": 1}, toy_items) == [0, 1, 4, 6, 7]  # not c (2), d (3), f (unknown)
    assert kept(rs, {"risk_tolerance": 3}, toy_items) == [0, 1, 2, 3, 4, 6, 7]
    assert kept(rs, {}, toy_items) == [0, 4, 6]  # default tolerance 0


def test_global_blocklist_by_id_and_category(toy_items):
    rs = rules({"id": "block", "kind": "blocklist", "items": {"item_ids": ["b", "not-in-catalog"],
                                                              "categories": ["Drama"]}})
    assert kept(rs, {"age": 40}, toy_items) == [0, 4, 7]


def test_a_blocklist_id_matches_the_catalog_id_it_spells(toy_items):
    # ids the catalog lacks match nothing, so an id written with padding or another Unicode spelling
    # blocked nothing; rule ids are read as the loaders read a catalog's ids (stripped, NFC)
    table = toy_items_table()
    for catalog in ("caf\u00e9", "cafe\u0301"):  # the second: a split saved before ids were NFC
        table.loc[1, "item_id"] = catalog
        items = ItemAttributes.from_items(table)
        for spelt in ("cafe\u0301", " caf\u00e9 ", "\tcafe\u0301"):
            assert kept(rules({"id": "w", "kind": "blocklist", "items": {"item_ids": [spelt]}}), {}, items) == \
                [0, 2, 3, 4, 5, 6, 7]


def test_blocklist_for_matching_users_only(toy_items):
    block = {"id": "no_gambling_u21", "kind": "blocklist", "items": {"tags": ["gambling"]},
             "when_user": {"age_below": 21}}
    assert kept(rules(block), {"age": 30}, toy_items) == list(range(8))
    # c is tagged gambling; g's attributes are malformed, so its tags are unknown: fail closed
    assert kept(rules(block), {"age": 19}, toy_items) == [0, 1, 3, 4, 5, 7]
    assert kept(rules(block), {}, toy_items) == [0, 1, 3, 4, 5, 7]
    assert kept(rules({**block, "when_user_unknown": "allow"}), {}, toy_items) == list(range(8))
    by_job = {"id": "job", "kind": "blocklist", "items": {"item_ids": ["a"]},
              "when_user": {"occupations": ["student"], "age_at_least": 10}}
    assert kept(rules(by_job), {"occupation": "student", "age": 12}, toy_items, [0, 1]) == [1]
    assert kept(rules(by_job), {"occupation": "doctor"}, toy_items, [0, 1]) == [0, 1]  # known mismatch wins


def test_blocklist_on_audience_fails_closed_on_unknown_audience(toy_items):
    rs = rules({"id": "no_teen", "kind": "blocklist", "items": {"audiences": ["teen"]}})
    assert kept(rs, {"age": 40}, toy_items) == [0, 1, 3, 5, 6]  # c, h teen; e unknown


def test_cap_keeps_the_best_ranked_n_of_the_category(toy_items):
    rs = rules({"id": "cap", "kind": "category_cap", "category": "Drama", "max_items": 2})
    assert kept(rs, {}, toy_items, [6, 5, 0, 3, 2, 7]) == [6, 5, 0, 7]


def test_cap_over_every_category_counts_only_kept_items(toy_items):
    rs = rules({"id": "cap", "kind": "category_cap", "max_items": 1})
    # g takes Drama; d (Drama+Horror) is over on Drama, so it does not use Horror: b still fits
    assert kept(rs, {}, toy_items, [6, 3, 1, 0, 7]) == [6, 1, 0]


def test_cap_applies_after_filters(toy_items):
    rs = rules({"id": "cap", "kind": "category_cap", "category": "Horror", "max_items": 1}, ADULT_GATE)
    assert kept(rs, {"age": 15}, toy_items, [1, 3]) == [3]  # b removed by the gate does not use the cap
    assert kept(rs, {"age": 40}, toy_items, [1, 3]) == [1]


def test_disclaimers_attach_to_kept_items_in_rule_order(toy_items):
    out = apply_rules(rules(ADULT_GATE, HORROR_NOTE, RISK_NOTE), {"age": 15}, toy_items, np.array([0, 1, 2, 3]))
    assert out.keep.tolist() == [True, False, True, True]
    assert out.disclaimers == {2: ["risky"], 3: ["scary", "risky"]}  # b is horror but not served


def test_disclaimer_that_cannot_be_evaluated_drops_the_item(toy_items):
    out = apply_rules(rules(RISK_NOTE), {}, toy_items, np.array([0, 5, 3]))
    assert out.keep.tolist() == [True, False, True]  # f's risk level is unknown
    assert out.removed == [(5, "risk_note")]
    assert out.disclaimers == {3: ["risky"]}


def test_removed_reasons_name_the_first_rule_that_removed_each_item(toy_items):
    rs = rules(ADULT_GATE, TEEN_GATE, {"id": "risk", "kind": "risk_tolerance", "default_tolerance": 1},
               {"id": "cap", "kind": "category_cap", "max_items": 1})
    out = apply_rules(rs, {"age": 12}, toy_items, np.array([7, 1, 2, 5, 3, 0, 6, 4]))
    assert out.removed == [(7, "teen_gate"), (1, "adult_gate"), (2, "teen_gate"), (5, "risk"),
                           (3, "risk"), (4, "adult_gate")]
    assert out.keep.tolist() == [False, False, False, False, False, True, True, False]


def test_rule_that_raises_removes_every_candidate(toy_items):
    out = apply_rules(rules(ADULT_GATE), {"age": "twelve"}, toy_items, np.array([0, 3]))
    assert out.keep.tolist() == [False, False]
    assert [item for item, _ in out.removed] == [0, 3]
    assert out.removed[0][1].startswith("adult_gate (evaluation failed: user attribute 'age'")


@pytest.mark.parametrize("bad_age", [True, 12.5, [12]])
def test_unreadable_ages_fail_closed(toy_items, bad_age):
    assert kept(rules(ADULT_GATE), {"age": bad_age}, toy_items, [0]) == []


def test_item_outside_the_catalog_is_removed(toy_items):
    out = apply_rules(rules(), {}, toy_items, np.array([0, 99, -1]))
    assert out.keep.tolist() == [True, False, False]
    assert out.removed == [(99, UNKNOWN_ITEM), (-1, UNKNOWN_ITEM)]


def test_empty_candidates(toy_items):
    out = apply_rules(rules(ADULT_GATE, HORROR_NOTE), {}, toy_items, np.zeros(0, dtype=np.int64))
    assert out.keep.tolist() == [] and out.removed == [] and out.disclaimers == {}
