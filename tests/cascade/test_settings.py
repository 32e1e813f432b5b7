import re
from pathlib import Path

import pytest

from cascade.settings import MAX_SEED, ConfigError, Settings


def test_default_yaml_validates_with_default_depths():
    s = Settings.from_yaml()
    depths = [(st.name, st.depth) for st in s.pipeline.stages]
    assert depths == [("recall", 200), ("coarse", 50), ("llm", 20), ("rules", None), ("fusion", None), ("caps", None)]


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"recal": {}}, "recal: Extra inputs"),
        ({"pipeline": {"stages": [{"name": "recall", "kind": "recall", "depth": 0, "on_error": "fail"}]}},
         "pipeline.stages.0.depth"),
        ({"pipeline": {"stages": [{"name": "recall", "kind": "nope", "on_error": "fail"}]}}, "unknown stage kind 'nope'"),
        ({"pipeline": {"stages": [{"name": "coarse", "kind": "coarse"}]}}, "must be a recall stage"),
        ({"pipeline": {"stages": [
            {"name": "recall", "kind": "recall", "depth": 50, "on_error": "fail"},
            {"name": "coarse", "kind": "coarse", "depth": 80}]}}, "depth 80 exceeds the previous stage depth 50"),
        ({"pipeline": {"stages": [
            {"name": "recall", "kind": "recall", "on_error": "fail"},
            {"name": "recall", "kind": "coarse"}]}}, "duplicate stage names ['recall']"),
        ({"serving": {"port": 70000}}, "serving.port"),
        # fusion, training and the evaluator find these stages by name: another name served recall's order
        ({"pipeline": {"stages": [{"name": "retrieval", "kind": "recall", "on_error": "fail"}]}},
         "pipeline.stages[0]: a recall stage must be named 'recall'"),
        ({"pipeline": {"stages": [{"name": "recall", "kind": "recall", "on_error": "fail"},
                                  {"name": "ranker", "kind": "coarse"}]}}, "a coarse stage must be named 'coarse'"),
        ({"pipeline": {"stages": [{"name": "recall", "kind": "recall", "on_error": "fail", "enabled": False}]}},
         "(recall) cannot be disabled"),  # it served every request an empty list
        ({"pipeline": {"request_budget_ms": 1e13}}, "pipeline.request_budget_ms: Input should be less than or equal"),
        ({"pipeline": {"stages": [{"name": "recall", "kind": "recall", "on_error": "fail"},
                                  {"name": "coarse", "kind": "coarse", "budget_ms": float("inf")}]}},
         "pipeline.stages.1.budget_ms"),  # a huge budget overflowed the watchdog: coarse fell back on every request
        ({"pipeline": {"stages": [{"name": "recall", "kind": "recall", "on_error": "fail", "params": {"nonsense": 1}}]}},
         "pipeline.stages[0] (recall) params: nonsense: Extra inputs are not permitted"),
        ({"pipeline": {"stages": [{"name": "recall", "kind": "recall", "on_error": "fail", "params": {"dim": 0}}]}},
         "pipeline.stages[0] (recall) params: dim: Input should be greater than or equal to 8"),
        ({"pipeline": {"stages": [{"name": "recall", "kind": "recall", "on_error": "fail"},
                                  {"name": "llm", "kind": "llm", "params": {"candidatez": 5}}]}},
         "pipeline.stages[1] (llm) params: candidatez"),
        ({"pipeline": {"stages": [{"name": "recall", "kind": "recall", "on_error": "fail"},
                                  {"name": "coarse", "kind": "coarse", "params": {"nonsense": 1}}]}},
         "stage 'coarse': params must be at most {subdir"),
        ({"pipeline": {"stages": [{"name": "recall", "kind": "recall", "on_error": "fail"},
                                  {"name": "rules", "kind": "rules_tagged", "params": {"apply": "bogus"}}]}},
         "stage 'rules': params.apply must be all, filters or caps"),
    ],
)
def test_bad_keys_are_named(data, needle):
    with pytest.raises(ConfigError) as err:
        Settings.build(data)
    assert needle in str(err.value)


def test_yaml_file_errors_name_the_file(tmp_path: Path):
    bad = tmp_path / "p.yaml"
    bad.write_text("pipeline: [1, 2\n")
    with pytest.raises(ConfigError, match="p.yaml: not valid YAML"):
        Settings.from_yaml(bad)
    with pytest.raises(ConfigError, match="config file not found"):
        Settings.from_yaml(tmp_path / "missing.yaml")
    bad.write_text("serving:\n  port: -1\n")
    with pytest.raises(ConfigError, match=r"p.yaml: invalid configuration\n  serving.port"):
        Settings.from_yaml(bad)


def test_env_overrides_yaml_and_overrides_win(monkeypatch, tmp_path: Path):
    cfg = tmp_path / "p.yaml"
    cfg.write_text("serving:\n  port: 8100\n")
    assert Settings.from_yaml(cfg).serving.port == 8100
    monkeypatch.setenv("RECSYS_SERVING__PORT", "9001")
    assert Settings.from_yaml(cfg).serving.port == 9001
    assert Settings.from_yaml(cfg, serving={"port": 9002}).serving.port == 9002


@pytest.mark.parametrize(("variable", "whole"), [("RECSYS_PIPELINE__STAGES__0__DEPTH", "RECSYS_PIPELINE__STAGES"),
                                                 ("RECSYS_SERVING__PORT__", "RECSYS_SERVING__PORT")])
def test_a_variable_nested_below_a_list_or_value_is_named_not_the_file(monkeypatch, variable, whole):
    # the natural try at one stage's depth; it used to be blamed on configs/pipeline.yaml alone
    monkeypatch.setenv(variable, "10")
    with pytest.raises(ConfigError) as err:
        Settings.from_yaml()
    assert f"from environment variable {variable}: it names a key inside" in str(err.value)
    assert f"set {whole} to " in str(err.value)


@pytest.mark.parametrize("variable", ["RECSYS_SEED__", "RECSYS_SEED__X", "RECSYS_ARTIFACTS_DIR__", "RECSYS_REDIS_URL__"])
def test_a_single_value_setting_written_as_a_section_is_refused_not_ignored(monkeypatch, variable):
    monkeypatch.setenv(variable, "7")  # pydantic-settings reads no such name: the run silently kept seed 42
    name = variable[len("RECSYS_"):].split("__")[0]
    with pytest.raises(ConfigError, match=f"environment variable {variable}: {name.lower()} is a single value"):
        Settings.from_yaml()


def test_a_misspelt_section_in_the_environment_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("RECSYS_SERVNG__PORT", "1")
    with pytest.raises(ConfigError, match="RECSYS_SERVNG__PORT: no settings section 'servng'"):
        Settings.build({})


def test_an_unparsable_environment_value_is_a_config_error(monkeypatch):
    monkeypatch.setenv("RECSYS_PIPELINE__STAGES", "[{")
    with pytest.raises(ConfigError, match="environment variable RECSYS_PIPELINE__STAGES: error parsing value "
                                          "for field \"pipeline\""):
        Settings.build({})


def test_a_bad_value_from_the_environment_is_blamed_on_the_variable(monkeypatch):
    monkeypatch.setenv("RECSYS_PIPELINE__MAX_K", "abc")
    with pytest.raises(ConfigError, match=r"pipeline.max_k: .* \(from environment variable RECSYS_PIPELINE__MAX_K\)"):
        Settings.build({})


@pytest.mark.parametrize("key", ["", " ", "short", " padded-admin-key-long-enough "])
def test_an_empty_or_guessable_admin_key_is_refused(monkeypatch, key):
    # an empty key matched a request without X-API-Key: PUT /admin/rules could switch compliance off
    monkeypatch.setenv("RECSYS_SERVING__ADMIN_API_KEY", key)
    with pytest.raises(ConfigError, match="serving.admin_api_key: .*at least 12 characters"):
        Settings.build({})
    monkeypatch.setenv("RECSYS_SERVING__ADMIN_API_KEY", "a-long-enough-key")
    assert Settings.build({}).serving.admin_api_key is not None


def test_config_files_are_bounded_like_admin_documents(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                    "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
                    "pipeline: {stages: [{name: recall, kind: recall, params: {x: [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c, *c]}}]}\n")
    with pytest.raises(ConfigError, match="bomb.yaml: document expands to more than"):
        Settings.from_yaml(bomb)
    dup = tmp_path / "dup.yaml"
    dup.write_text("seed: 1\nseed: 2\n")
    with pytest.raises(ConfigError, match="dup.yaml: not valid YAML/JSON: found duplicate key 'seed'"):
        Settings.from_yaml(dup)
    (tmp_path / "empty.yaml").write_text("# nothing set\n")
    assert Settings.from_yaml(tmp_path / "empty.yaml").seed == Settings.build({}).seed


def test_a_rules_stage_with_a_bad_apply_is_refused_with_the_config():
    stages = [{"name": "recall", "kind": "recall", "depth": 50, "on_error": "fail"},
              {"name": "rules", "kind": "rules", "params": {"apply": "bogus"}}]
    with pytest.raises(ConfigError, match="params.apply must be all, filters or caps"):
        Settings.build({"pipeline": {"stages": stages}})


@pytest.mark.parametrize(("text", "key"), [
    ("seed: true\n", "seed"),
    ("recall:\n  max_len: yes\n", "recall.max_len"),  # YAML 1.1: yes is a boolean
    ("recall:\n  max_train_logits: off\n", "recall.max_train_logits"),
    ("pipeline:\n  stages:\n    - {name: recall, kind: recall, depth: true}\n", "pipeline.stages.0.depth"),
    ("pipeline:\n  stages:\n    - {name: recall, kind: recall, params: {dim: false}}\n",
     "pipeline.stages.0.params.dim"),
    ("fusion:\n  weights: {coarse: 1.0, recall: true}\n", "fusion.weights.recall"),
])
def test_a_boolean_for_a_number_is_refused_by_key(tmp_path: Path, text: str, key: str):
    # pydantic's lax mode read them as 1 or 0: `seed: true` trained with seed 1, `max_len: yes` read one item
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"c.yaml: invalid configuration\n  {key}: a number, got true/false"):
        Settings.from_yaml(path)


@pytest.mark.parametrize(("text", "key"), [
    ("1: 2\n", "1: a section name must be a string, got int"),
    ("null: x\n", "None: a section name must be a string, got NoneType"),
    ("yes: x\n", "True: a section name must be a string, got bool"),
    ("seed: 3\n2020-01-01: x\n", "datetime.date(2020, 1, 1): a section name must be a string, got date"),
])
def test_a_section_name_that_is_not_a_string_is_refused_naming_it(tmp_path: Path, text: str, key: str):
    path = tmp_path / "c.yaml"  # pydantic-settings used to crash on it (AttributeError: no .lower())
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(f"c.yaml: invalid configuration\n  {key}; known: [")):
        Settings.from_yaml(path)


@pytest.mark.parametrize("seed", [-1, 2**31, 10**30])
def test_a_seed_outside_what_every_library_takes_is_refused_naming_seed(seed: int, monkeypatch):
    with pytest.raises(ConfigError, match="seed: Input should be (greater|less) than or equal to"):
        Settings.build({"seed": seed})
    monkeypatch.setenv("RECSYS_SEED", str(seed))
    with pytest.raises(ConfigError, match="seed: .*from environment variable RECSYS_SEED"):
        Settings.build({})


def test_the_largest_seed_trains_everywhere_and_seed_runs_may_not_pass_it(tmp_path: Path):
    import lightgbm as lgb
    import numpy as np
    import torch

    from jobs.evaluation.seeds import seed_dirs

    top = Settings.build({"seed": MAX_SEED}).seed
    np.random.default_rng(top)
    torch.manual_seed(top)
    lgb.LGBMRanker(random_state=top, n_estimators=1, verbose=-1).fit(
        np.arange(8.0).reshape(4, 2), [0, 1, 0, 1], group=[2, 2])
    assert [s for s, _ in seed_dirs(tmp_path, top - 1, 2)] == [top - 1, top]
    with pytest.raises(ValueError, match=f"--seeds 3 from seed {top - 1} reaches seed {top + 1}, past the largest"):
        seed_dirs(tmp_path, top - 1, 3)


def test_booleans_stay_booleans_and_numbers_numbers(monkeypatch):
    settings = Settings.build({"recall": {"use_text": False, "max_len": 7}, "seed": 3})
    assert settings.recall.use_text is False and settings.recall.max_len == 7 and settings.seed == 3
    monkeypatch.setenv("RECSYS_SEED", "5")  # the environment's strings are parsed, never booleans
    assert Settings.build({}).seed == 5
    with pytest.raises(ConfigError, match="overrides: invalid configuration\n  seed: a number"):
        Settings.build({}, seed=True)
