"""Rule set validation: errors name the rule (id and index) and the bad key."""

import pytest

from rules.config import RULESETS_DIR, RulesConfig
from rules.schema import AudienceGateRule, CategoryCapRule, RulesError, load_ruleset, parse_ruleset

GOOD = {"id": "withdrawn", "kind": "blocklist", "items": {"item_ids": ["x"]}}


def parse(*raw, version="v1"):
    return parse_ruleset({"version": version, "rules": list(raw)}, source="test.yaml")


def test_valid_rule_set_keeps_rules_in_order_with_their_types():
    rs = parse(GOOD, {"id": "adult_gate", "kind": "audience_gate", "audience": "adult", "min_age": "18"},
               {"id": "cap", "kind": "category_cap", "max_items": 4}, version=3)
    assert rs.version == "3"
    assert [r.id for r in rs.rules] == ["withdrawn", "adult_gate", "cap"]
    assert isinstance(rs.rules[1], AudienceGateRule) and rs.rules[1].min_age == 18
    assert isinstance(rs.rules[2], CategoryCapRule) and rs.rules[2].category is None


def test_bad_value_names_rule_index_and_key():
    with pytest.raises(RulesError) as err:
        parse(GOOD, {"id": "adult_gate", "kind": "audience_gate", "audience": "adult", "min_age": "eighteen"})
    assert str(err.value) == "test.yaml: rule 'adult_gate' (rules[1]): min_age must be an integer"


def test_unknown_kind_is_named():
    with pytest.raises(RulesError, match=r"rule 'x' \(rules\[0\]\): unknown kind 'teleport'; known kinds: \["):
        parse({"id": "x", "kind": "teleport"})


def test_unknown_and_missing_keys_are_named():
    with pytest.raises(RulesError, match=r"rule 'cap' \(rules\[0\]\): colour is not a known key"):
        parse({"id": "cap", "kind": "category_cap", "max_items": 2, "colour": "red"})
    with pytest.raises(RulesError, match=r"rule 'note' \(rules\[0\]\): text is required"):
        parse({"id": "note", "kind": "disclaimer", "items": {"categories": ["Horror"]}})
    with pytest.raises(RulesError, match=r"test.yaml: rules\[0\]: id is required"):
        parse({"kind": "risk_tolerance"})


def test_out_of_range_and_empty_selector_are_refused():
    with pytest.raises(RulesError, match=r"rule 'risk' \(rules\[0\]\): default_tolerance: Input should be less than or equal to 3"):
        parse({"id": "risk", "kind": "risk_tolerance", "default_tolerance": 9})
    with pytest.raises(RulesError, match=r"rule 'b' \(rules\[0\]\): items: selects nothing"):
        parse({"id": "b", "kind": "blocklist", "items": {}})
    with pytest.raises(RulesError, match=r"rule 'g' \(rules\[0\]\): when_user_unknown"):
        parse({"id": "g", "kind": "audience_gate", "audience": "adult", "min_age": 18, "when_user_unknown": "maybe"})


def test_duplicate_ids_missing_version_and_bad_shapes():
    with pytest.raises(RulesError, match=r"rule 'withdrawn' \(rules\[1\]\): duplicate id"):
        parse(GOOD, GOOD)
    with pytest.raises(RulesError, match="'version' is required"):
        parse_ruleset({"rules": []})
    with pytest.raises(RulesError, match=r"rules\[0\] must be a mapping"):
        parse("blocklist")
    with pytest.raises(RulesError, match=r"unknown top-level key\(s\) \['rule'\]"):
        parse_ruleset({"version": "1", "rule": []})


def test_load_ruleset_names_the_file(tmp_path):
    with pytest.raises(RulesError, match="rule set file not found"):
        load_ruleset(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nrules: [{id: a, kind: audience_gate, audience: adult, min_age: x}]\n")
    with pytest.raises(RulesError, match=rf"{bad}: rule 'a' \(rules\[0\]\): min_age must be an integer"):
        load_ruleset(bad)


def test_packaged_rule_sets_load_and_movielens_has_no_audience_gate():
    default = load_ruleset(RULESETS_DIR / "default.yaml")
    movielens = load_ruleset(RULESETS_DIR / "movielens.yaml")
    assert {r.kind for r in default.rules} == {"blocklist", "audience_gate", "risk_tolerance",
                                               "category_cap", "disclaimer"}
    assert {r.kind for r in movielens.rules} == {"blocklist", "category_cap", "disclaimer"}
    assert default.version and movielens.version and default.version != movielens.version


def test_config_picks_packaged_rule_set_by_dataset(tmp_path):
    cfg = RulesConfig()
    assert cfg.ruleset_path("ml-100k") == RULESETS_DIR / "movielens.yaml"
    assert cfg.ruleset_path("synthetic") == RULESETS_DIR / "default.yaml"
    assert RulesConfig(ruleset=tmp_path / "mine.yaml").ruleset_path("ml-100k") == tmp_path / "mine.yaml"
    with pytest.raises(ValueError, match="no packaged rule set 'nope'"):
        RulesConfig(packaged_for_dataset={"x": "nope"})
