"""RulesStage: loads rule set + item arrays from an artifact dir, filters in order, fails closed."""

import numpy as np
import pandas as pd
import pytest

from cascade.registry import build_stage
from cascade.settings import Settings
from offline.schema import Vocab
from offline.split import Split
from recsys.config import StageSpec
from recsys.contract import Candidates, Request, Stage
from recsys.pipeline import Pipeline, PipelineError
from rules.config import RULESETS_DIR, RulesConfig
from rules.items import ItemAttributes
from rules.schema import RulesError, load_ruleset
from rules.stage import RulesStage
from tests.rules.conftest import toy_items_table

RULES_YAML = """
version: toy-7
rules:
  - {id: adult_gate, kind: audience_gate, audience: adult, min_age: 18}
  - {id: horror_note, kind: disclaimer, text: scary, items: {categories: [Horror]}}
  - {id: drama_cap, kind: category_cap, category: Drama, max_items: 1}
"""


def save_toy_split(root, name="toy", items=None, users=None):
    items = toy_items_table() if items is None else items
    users = pd.DataFrame({"user_id": ["u0"], "age": pd.array([30], dtype="Int64")}) if users is None else users
    train = pd.DataFrame({"user_idx": [0], "item_idx": [0], "rating": [5.0], "timestamp": [1]})
    Split(name=name, vocab=Vocab.build(users["user_id"], items["item_id"]), items=items, users=users,
          train=train, valid=np.array([1]), test=np.array([2]), valid_ts=np.array([2]),
          test_ts=np.array([3])).save(root / "split")


@pytest.fixture
def stage(tmp_path):
    save_toy_split(tmp_path)
    (tmp_path / "rules.yaml").write_text(RULES_YAML)
    stage = RulesStage(StageSpec(name="rules", kind="rules"), RulesConfig(ruleset=tmp_path / "rules.yaml"))
    stage.load(tmp_path)
    return stage


def cands(items):
    items = np.asarray(items)
    return Candidates(items=items).with_scores("coarse", -np.arange(len(items), dtype=np.float32))


def test_implements_stage_and_reports_rule_set_version(stage):
    assert isinstance(stage, Stage)
    assert (stage.name, stage.reads, stage.writes) == ("rules", (), ())
    assert stage.version() == "toy-7"


def test_filters_keeping_order_and_attaches_disclaimers(stage):
    before = cands([3, 1, 2, 0, 5])
    out = stage.run(Request(user_id="kid", user_attrs={"age": 12}), before)
    # b (adult) gated; d keeps the one Drama slot so c and f are capped
    assert out.items.tolist() == [3, 0]
    assert out.scores["coarse"].tolist() == [0.0, -3.0]
    assert out.order_by == "coarse"
    assert out.disclaimers == {3: ["scary"]}
    assert out.removed == []  # reasons only in debug mode
    assert before.items.tolist() == [3, 1, 2, 0, 5] and before.disclaimers == {} and before.removed == []


def test_debug_records_which_rule_removed_which_item(stage):
    out = stage.run(Request(user_id="kid", user_attrs={}, debug=True), cands([3, 1, 2, 0, 5]))
    assert out.removed == [(1, "adult_gate"), (2, "drama_cap"), (5, "drama_cap")]


def test_existing_disclaimers_and_reasons_are_kept(stage):
    before = cands([3, 0])
    before.disclaimers = {3: ["from llm"], 0: ["x"]}
    before.removed = [(9, "recall: excluded")]
    out = stage.run(Request(user_id="u", user_attrs={"age": 30}, debug=True), before)
    assert out.disclaimers == {3: ["from llm", "scary"], 0: ["x"]}
    assert out.removed == [(9, "recall: excluded")]
    assert before.disclaimers == {3: ["from llm"], 0: ["x"]}


def movie_like_items():
    """The toy catalog as MovieLens ships it: categories, no audience rating, no risk level."""
    items = toy_items_table()
    return items.assign(audience=None, risk_level=pd.array([None] * len(items), dtype="Int64"))


@pytest.mark.parametrize("name", ["ml-100k", "my-movies", "synthetic"])
def test_default_rule_set_fits_the_catalog_not_its_name(tmp_path, name):
    save_toy_split(tmp_path, name=name, items=movie_like_items())
    stage = RulesStage(StageSpec(name="rules", kind="rules"), RulesConfig())
    stage.load(tmp_path)
    assert stage.ruleset_path == RULESETS_DIR / "default.yaml"
    assert stage.skipped == {"adult_gate": "no item carries audience", "teen_gate": "no item carries audience",
                             "risk_tolerance": "no item carries risk_level",
                             "high_risk_disclaimer": "no item carries risk_level"}
    # a user of unknown age keeps every movie: nothing the catalog lacks removes anything
    out = stage.run(Request(user_id="new", user_attrs={}), cands([3, 1, 2, 0, 5]))
    assert out.items.tolist() == [3, 1, 2, 0, 5]
    assert out.disclaimers == {3: ["Contains frightening scenes."], 1: ["Contains frightening scenes."]}


def test_default_rule_set_gates_where_the_catalog_carries_audience_and_risk(tmp_path):
    save_toy_split(tmp_path, name="ml-100k")  # the name no longer matters: the toy items carry both
    stage = RulesStage(StageSpec(name="rules", kind="rules"), RulesConfig())
    stage.load(tmp_path)
    assert stage.skipped == {}
    out = stage.run(Request(user_id="new", user_attrs={}, debug=True), cands([0, 1, 2, 4, 5]))
    # unknown age counts as a minor: b (adult) and c (teen) gated, e (audience unknown) fails closed,
    # f (risk unknown) fails closed on the risk rule
    assert out.items.tolist() == [0]
    assert dict(out.removed) == {1: "adult_gate", 2: "teen_gate", 4: "adult_gate", 5: "risk_tolerance"}


def write_rules(tmp_path, body: str):
    path = tmp_path / "rules.yaml"
    path.write_text("version: t-1\nrules:\n" + body)
    return RulesConfig(ruleset=path)


def test_rule_on_an_attribute_no_item_carries_is_refused_at_start_up(tmp_path):
    save_toy_split(tmp_path, items=movie_like_items())
    settings = write_rules(tmp_path, "  - {id: adult_gate, kind: audience_gate, audience: adult, min_age: 18}\n")
    stage = RulesStage(StageSpec(name="rules", kind="rules"), settings)
    with pytest.raises(RulesError, match=r"rule 'adult_gate' \(rules\[0\]\): no item carries audience"):
        stage.load(tmp_path)
    settings = write_rules(tmp_path, "  - {id: no_risky, kind: blocklist, items: {min_risk_level: 2}}\n")
    with pytest.raises(RulesError, match="rule 'no_risky' .*no item carries risk_level"):
        RulesStage(StageSpec(name="rules", kind="rules"), settings).load(tmp_path)


def test_rule_on_an_attribute_no_user_carries_is_refused_unless_it_says_how(tmp_path):
    no_ages = pd.DataFrame({"user_id": ["u0"], "age": pd.array([None], dtype="Int64")})
    save_toy_split(tmp_path, users=no_ages)
    gate = "  - {id: adult_gate, kind: audience_gate, audience: adult, min_age: 18"
    with pytest.raises(RulesError, match="rule 'adult_gate' .*no user carries age in this catalog; say how"):
        RulesStage(StageSpec(name="rules", kind="rules"), write_rules(tmp_path, gate + "}\n")).load(tmp_path)
    stated = RulesStage(StageSpec(name="rules", kind="rules"),
                        write_rules(tmp_path, gate + ", when_user_unknown: restrict}\n"))
    stated.load(tmp_path)  # the rule says what an unknown age means: it applies as written
    assert stated.run(Request(user_id="u", user_attrs={}), cands([0, 1])).items.tolist() == [0]


@pytest.mark.parametrize(("mode", "expected"), [("skip", [0, 1, 4]), ("enforce", [])])
def test_on_absent_attribute_skip_turns_the_rule_off_and_enforce_fails_closed(tmp_path, mode, expected):
    save_toy_split(tmp_path, items=movie_like_items())
    body = f"  - {{id: adult_gate, kind: audience_gate, audience: adult, min_age: 18, on_absent_attribute: {mode}}}\n"
    stage = RulesStage(StageSpec(name="rules", kind="rules"), write_rules(tmp_path, body))
    stage.load(tmp_path)
    assert stage.run(Request(user_id="kid", user_attrs={"age": 9}), cands([0, 1, 4])).items.tolist() == expected
    assert stage.version() == "t-1"


def test_rules_and_a_split_saved_before_names_were_nfc_meet_in_one_spelling(tmp_path):
    # a decomposed category, tag and id in an old split; the rule document spells them precomposed.
    # The category check compared raw names: refused ("no item carries 'Comédie' (did you mean 'Comédie'?)"),
    # or with on_absent_attribute: skip, switched off, serving what the rule blocked before
    items = toy_items_table()
    items.at[0, "categories"] = ["Come\u0301die"]
    items.at[2, "attributes"] = '{"tags": ["jeu", "parie\u0301"]}'
    items.at[4, "item_id"] = "cafe\u0301"
    save_toy_split(tmp_path, items=items, users=pd.DataFrame({"user_id": ["u0"], "occupation": ["e\u0301tudiant"]}))
    body = ("  - {id: cat, kind: blocklist, items: {categories: [Com\u00e9die]}}\n"
            "  - {id: tag, kind: blocklist, items: {tags: [pari\u00e9]}}\n"
            "  - {id: ids, kind: blocklist, items: {item_ids: [caf\u00e9]}, when_user: {occupations: [\u00e9tudiant]}}\n")
    stage = RulesStage(StageSpec(name="rules", kind="rules"), write_rules(tmp_path, body))
    stage.load(tmp_path)
    student = Request(user_id="u", user_attrs={"occupation": "e\u0301tudiant"})
    assert stage.run(student, cands(range(8))).items.tolist() == [1, 3, 5, 7]  # not a, c, e (g: tags unknown)


def test_check_refuses_before_install_and_keeps_the_serving_rule_set(tmp_path):
    save_toy_split(tmp_path, items=movie_like_items())
    stage = RulesStage(StageSpec(name="rules", kind="rules"), RulesConfig())
    stage.load(tmp_path)
    bad = load_ruleset(write_rules(tmp_path, "  - {id: gate, kind: audience_gate, audience: teen, min_age: 13}\n")
                       .ruleset)
    with pytest.raises(RulesError, match="rule 'gate' .*no item carries audience"):
        stage.check(bad)
    with pytest.raises(RulesError):
        stage.use(bad, stage.items)
    assert stage.version() == load_ruleset(RULESETS_DIR / "default.yaml").version


def test_run_before_load_is_an_error_and_the_pipeline_fails_closed(tmp_path):
    stage = RulesStage(StageSpec(name="rules", kind="rules", on_error="fail"), RulesConfig())
    with pytest.raises(RuntimeError, match="before load"):
        stage.run(Request(user_id="u"), cands([0]))
    pipe = Pipeline([(StageSpec(name="rules", kind="rules", on_error="fail"), stage)])
    with pytest.raises(PipelineError, match="stage 'rules' failed"):
        pipe.run(Request(user_id="u"))


@pytest.mark.ml100k
def test_movielens_rules_on_the_real_catalog(ml100k_dir):
    from offline.loaders import load_dataset

    items = ItemAttributes.from_items(load_dataset(ml100k_dir).items)
    ruleset = load_ruleset(RULESETS_DIR / "movielens.yaml")
    stage = RulesStage(StageSpec(name="rules", kind="rules"), RulesConfig())
    stage.use(ruleset, items)
    horror = int(np.flatnonzero(items.categories[:, items.category_names.index("Horror")])[0])
    placeholder = int(items.indices_of(["267"])[0])
    comedies = np.flatnonzero(items.categories[:, items.category_names.index("Comedy")])[:8]
    order = np.concatenate([[placeholder, horror], comedies])
    out = stage.run(Request(user_id="kid", user_attrs={"age": 9}, debug=True), cands(order))
    # no audience gate on MovieLens: a 9-year-old loses only the placeholder and the 7th+ comedy
    assert out.items[:2].tolist() == [horror, comedies[0]]
    assert (placeholder, "placeholder_item") in out.removed
    assert items.categories[out.items, items.category_names.index("Comedy")].sum() == 6
    assert out.disclaimers[horror] == ["Contains frightening scenes."]


class FixedRecall:
    """Recall returning a fixed list: recall scores descending, coarse scores ascending."""

    name, reads, writes = "recall", (), ("recall", "coarse")

    def load(self, artifact_dir) -> None: ...

    def version(self) -> str:
        return "fixed-1"

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        items = np.array([6, 5, 3, 2, 0, 7])
        rank = np.arange(len(items), dtype=np.float32)
        return Candidates(items=items, scores={"coarse": rank}).with_scores("recall", -rank)


def test_cap_holds_after_fusion_reorders(stage):
    fusion = build_stage(StageSpec(name="fusion", kind="fusion", params={"weights": {"coarse": 1.0}}),
                         Settings.build({}))
    pipe = Pipeline([(StageSpec(name="recall", kind="recall", on_error="fail"), FixedRecall()),
                     (StageSpec(name="rules", kind="rules", on_error="fail"), stage),
                     (StageSpec(name="fusion", kind="fusion", depth=10), fusion)])
    result = pipe.run(Request(user_id="u", k=10, user_attrs={"age": 30}))
    # rules keep g (the one Drama slot, best in recall order), a, h; fusion reverses them by coarse
    assert result.candidates.items.tolist() == [7, 0, 6]
    assert result.versions["rules"] == "toy-7"


@pytest.mark.parametrize(
    ("apply", "expected"),
    [
        # items 3,1,2,0,5 for a 12-year-old: 1 (adult) is gated; Drama: 3, 2, 5 (only one may stay)
        ("filters", [3, 2, 0, 5]),  # gate only, no cap
        ("caps", [3, 1, 0]),  # cap only: 3 keeps the Drama slot, 2 and 5 go; no gate
        ("all", [3, 0]),
    ],
)
def test_apply_param_splits_filters_from_caps(tmp_path, apply, expected):
    save_toy_split(tmp_path)
    (tmp_path / "rules.yaml").write_text(RULES_YAML)
    spec = StageSpec(name="r", kind="rules", params={"apply": apply})
    s = RulesStage(spec, RulesConfig(ruleset=tmp_path / "rules.yaml"))
    s.load(tmp_path)
    assert s.run(Request(user_id="kid", user_attrs={"age": 12}), cands([3, 1, 2, 0, 5])).items.tolist() == expected


def test_apply_param_is_validated():
    with pytest.raises(ValueError, match="params.apply must be all, filters or caps, got 'some'"):
        RulesStage(StageSpec(name="r", kind="rules", params={"apply": "some"}), RulesConfig())


def test_skip_never_turns_a_gate_off_because_users_lack_the_attribute(tmp_path):
    # items carry audience ratings, no user carries an age: skipping the gate would show adult items to all
    no_ages = pd.DataFrame({"user_id": ["u0"], "age": pd.array([None], dtype="Int64")})
    save_toy_split(tmp_path, users=no_ages)
    gate = "  - {id: adult_gate, kind: audience_gate, audience: adult, min_age: 18"
    with pytest.raises(RulesError, match="no user carries age in this catalog; say how to treat such users "
                                         "with when_user_unknown: restrict"):
        RulesStage(StageSpec(name="rules", kind="rules"), write_rules(tmp_path, gate + "}\n")).load(tmp_path)
    skip = RulesStage(StageSpec(name="rules", kind="rules"),
                      write_rules(tmp_path, gate + ", on_absent_attribute: skip}\n"))
    skip.load(tmp_path)
    assert skip.skipped == {}
    assert skip.run(Request(user_id="u", user_attrs={}), cands([0, 1])).items.tolist() == [0]  # b is adult


def test_a_category_no_item_carries_is_refused_naming_the_close_match(tmp_path):
    save_toy_split(tmp_path)  # categories: Comedy, Horror, Drama
    body = "  - {id: no_horror, kind: blocklist, items: {categories: [horror]}}\n"
    with pytest.raises(RulesError, match=r"rule 'no_horror' \(rules\[0\]\): no item carries category 'horror' "
                                         r"\(did you mean 'Horror'\?\)"):
        RulesStage(StageSpec(name="rules", kind="rules"), write_rules(tmp_path, body)).load(tmp_path)
    cap = "  - {id: cap, kind: category_cap, category: Dramma, max_items: 1}\n"
    with pytest.raises(RulesError, match="no item carries category 'Dramma' \\(did you mean 'Drama'\\?\\)"):
        RulesStage(StageSpec(name="rules", kind="rules"), write_rules(tmp_path, cap)).load(tmp_path)
    # under skip: a rule none of whose categories exist is off; one with some real categories stays on
    both = ("  - {id: none_exist, kind: blocklist, items: {categories: [Western]}, on_absent_attribute: skip}\n"
            "  - {id: some_exist, kind: blocklist, items: {categories: [Western, Horror]}, on_absent_attribute: skip}\n")
    stage = RulesStage(StageSpec(name="rules", kind="rules"), write_rules(tmp_path, both))
    stage.load(tmp_path)
    assert stage.skipped == {"none_exist": "no item carries category 'Western'"}
    assert stage.run(Request(user_id="u", user_attrs={}), cands([0, 1, 3])).items.tolist() == [0]
