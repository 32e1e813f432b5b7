"""Rule set validation: errors name the rule (id and index) and the bad key."""

import re

import pytest
import yaml

from rules.config import RULESETS_DIR, RulesConfig
from rules.schema import AudienceGateRule, CategoryCapRule, RulesError, load_ruleset, parse_ruleset

GOOD = {"id": "withdrawn", "kind": "blocklist", "items": {"item_ids": ["x"]}}


def parse(*raw, version="v1"):
    return parse_ruleset({"version": version, "rules": list(raw)}, source="test.yaml")


def test_valid_rule_set_keeps_rules_in_order_with_their_types():
    rs = parse(GOOD, {"id": "adult_gate", "kind": "audience_gate", "audience": "adult", "min_age": 18},
               {"id": "cap", "kind": "category_cap", "max_items": 4}, version="3")
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


@pytest.mark.parametrize("kind", [["blocklist"], {"a": 1}, None, 3])
def test_a_kind_that_is_not_a_string_is_named_not_a_crash(kind: object):
    # a list or mapping used to raise TypeError (unhashable) through PUT /admin/rules: a 500
    with pytest.raises(RulesError, match=rf"rule 'x' \(rules\[0\]\): kind must be one of \[.*\], got {type(kind).__name__}"):
        parse({"id": "x", "kind": kind, "items": {"item_ids": ["m1"]}})


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


@pytest.mark.parametrize(("given", "problem"), [
    ("", "is empty"), ("   ", "is empty"), ("m\u200b6", "contains an invisible format character"),
    ("\x1fa", "contains a control character"), ("x" * 513, "is 513 characters long (at most 512)"),
])
def test_a_rule_item_id_no_catalog_can_hold_is_refused_by_name(given: str, problem: str):
    # such an id matched nothing: a blocklist that blocked nothing passed the "selects nothing" check
    with pytest.raises(RulesError, match=r"rule 'w' \(rules\[0\]\): items.item_ids: .*item id " + re.escape(repr(given))
                       + " " + re.escape(problem)):
        parse({"id": "w", "kind": "blocklist", "items": {"item_ids": ["ok", given]}})


def test_rule_ids_and_category_names_are_read_in_one_spelling():
    [block, cap] = parse({"id": "w", "kind": "blocklist", "items": {"item_ids": ["\tcafe\u0301 "],
                                                                   "categories": ["Come\u0301die"]}},
                         {"id": "c", "kind": "category_cap", "max_items": 1, "category": "Come\u0301die"}).rules
    assert block.items.item_ids == ["caf\u00e9"] and block.items.categories == ["Com\u00e9die"]
    assert cap.category == "Com\u00e9die"


def test_duplicate_ids_missing_version_and_bad_shapes():
    with pytest.raises(RulesError, match=r"rule 'withdrawn' \(rules\[1\]\): duplicate id"):
        parse(GOOD, GOOD)
    with pytest.raises(RulesError, match="'version' is required"):
        parse_ruleset({"rules": []})
    with pytest.raises(RulesError, match=r"rules\[0\] must be a mapping"):
        parse("blocklist")
    with pytest.raises(RulesError, match=r"unknown top-level key\(s\) \['rule'\]"):
        parse_ruleset({"version": "1", "rule": []})


REQUIRED = ("t.yaml: 'rules' is required: a rule set without rules turns every compliance rule off "
            "(write 'rules: []' with 'allow_empty: true' if that is meant)")
EMPTY = "t.yaml: 'rules' is empty: every compliance rule would be off (add 'allow_empty: true' if that is meant)"


@pytest.mark.parametrize(("data", "message"), [
    ({"version": "open-1"}, REQUIRED),
    ({"version": "open-1", "description": "no rules"}, REQUIRED),
    ({"version": "open-1", "rules": None}, "t.yaml: 'rules' must be a list"),
    ({"version": "open-1", "rules": []}, EMPTY),
    ({"version": "open-1", "rules": [], "allow_empty": False}, EMPTY),
])
def test_a_rule_set_without_rules_is_refused(data, message):
    """Fail closed: an empty rule set would serve adult and high-risk items to everyone."""
    with pytest.raises(RulesError) as err:
        parse_ruleset(data, source="t.yaml")
    assert str(err.value) == message


def test_an_empty_rule_set_needs_an_explicit_allow_empty():
    rs = parse_ruleset({"version": "open-1", "rules": [], "allow_empty": True})
    assert (rs.version, rs.rules, rs.allow_empty) == ("open-1", (), True)
    with pytest.raises(RulesError, match=r"^t.yaml: 'allow_empty' must be true or false, got 'yes please'$"):
        parse_ruleset({"version": "open-1", "rules": [], "allow_empty": "yes please"}, source="t.yaml")
    with pytest.raises(RulesError, match="'rules' is required"):  # allow_empty alone does not stand for rules: []
        parse_ruleset({"version": "open-1", "allow_empty": True})


@pytest.mark.parametrize(("text", "read_as"), [("1.10", "float 1.1"), ("010", "int 8"), ("3", "int 3"),
                                               ("yes", "bool True"), ("2024-01-02", "date datetime.date(2024, 1, 2)")])
def test_a_version_yaml_would_mangle_is_refused_naming_the_problem(text, read_as):
    data = yaml.safe_load(f"version: {text}\nrules: [{{id: w, kind: blocklist, items: {{item_ids: [x]}}}}]")
    with pytest.raises(RulesError) as err:
        parse_ruleset(data, source="t.yaml")
    assert str(err.value) == (f"t.yaml: 'version' must be a string, got {read_as}: YAML reads an unquoted 1.10 "
                              "as the number 1.1; quote it (version: \"1.10\")")
    quoted = yaml.safe_load(f"version: '{text}'\nrules: [{{id: w, kind: blocklist, items: {{item_ids: [x]}}}}]")
    assert parse_ruleset(quoted).version == text


def test_load_ruleset_names_the_file(tmp_path):
    with pytest.raises(RulesError, match="rule set file not found"):
        load_ruleset(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: '1'\nrules: [{id: a, kind: audience_gate, audience: adult, min_age: x}]\n")
    with pytest.raises(RulesError, match=rf"{bad}: rule 'a' \(rules\[0\]\): min_age must be an integer"):
        load_ruleset(bad)


def test_packaged_rule_sets_load_and_default_rules_skip_where_the_catalog_lacks_the_attribute():
    default = load_ruleset(RULESETS_DIR / "default.yaml")
    movielens = load_ruleset(RULESETS_DIR / "movielens.yaml")
    assert {r.kind for r in default.rules} == {"blocklist", "audience_gate", "risk_tolerance", "disclaimer"}
    # every default rule that reads an attribute says what happens on a catalog without it
    assert all(r.on_absent_attribute == "skip" for r in default.rules if r.kind != "blocklist")
    assert {r.kind for r in movielens.rules} == {"blocklist", "category_cap", "disclaimer"}
    assert default.version and movielens.version and default.version != movielens.version


def test_config_takes_the_explicit_rule_set_else_the_packaged_default(tmp_path):
    assert RulesConfig().ruleset_path() == RULESETS_DIR / "default.yaml"
    (tmp_path / "mine.yaml").write_text((RULESETS_DIR / "movielens.yaml").read_text())
    assert RulesConfig(ruleset=tmp_path / "mine.yaml").ruleset_path() == tmp_path / "mine.yaml"
    assert RulesConfig(ruleset=tmp_path / "mine.yaml").ruleset_path(tmp_path / "stage.yaml") == tmp_path / "stage.yaml"
    with pytest.raises(ValueError, match="packaged_for_dataset"):
        RulesConfig(packaged_for_dataset={"ml-100k": "movielens"})  # the dataset-name map is gone


@pytest.mark.parametrize("min_age", ["18", "yes", True, 17.5])
def test_rule_numbers_are_strict_so_a_loose_value_never_opens_a_gate(min_age):
    # `min_age: yes` was read as True == 1: a 15-year-old then saw adult items
    with pytest.raises(RulesError, match=r"rule 'g' \(rules\[0\]\): min_age must be an integer"):
        parse_ruleset({"version": "1", "rules": [{"id": "g", "kind": "audience_gate", "audience": "adult",
                                                  "min_age": min_age}]})
    with pytest.raises(RulesError, match="description must be a string"):
        parse_ruleset({"version": "1", "rules": [{"id": "b", "kind": "blocklist", "description": {"a": 1},
                                                  "items": {"item_ids": ["1"]}}]})
    with pytest.raises(RulesError, match="max_items: Input should be less than or equal to 100000"):
        parse_ruleset({"version": "1", "rules": [{"id": "c", "kind": "category_cap", "max_items": 10**23}]})


@pytest.mark.parametrize(("text", "problem"), [
    (None, "rule set file not found"),
    ("version: a\nrules: [{id: b, kind: blocklist, items: [x]}]\nrules: []\nallow_empty: true\n",
     "found duplicate key 'rules'"),  # the blocklist would silently vanish
    ("version: a\ndescription: &a [x, x, x, x, x, x, x, x, x, x]\nd2: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     "d3: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd4: [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n",
     "expands to more than"),
    ("version: \"a\\nb\"\nrules: [{id: b, kind: blocklist, items: [x]}]\n", "holds a control character"),
    ("version: a\ndescription: [1, 2]\nrules: [{id: b, kind: blocklist, items: [x]}]\n", "'description' must be a string"),
])
def test_a_rule_set_file_is_read_as_the_admin_api_reads_a_document(tmp_path, text, problem):
    # start-up files and PUT /admin/rules share one reader: what serving refuses is refused everywhere
    path = tmp_path / "r.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(RulesError, match=problem):
        load_ruleset(path)
    with pytest.raises(ValueError, match=problem):  # and with the config, not minutes into training
        RulesConfig(ruleset=path)
