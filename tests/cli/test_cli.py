"""The ``recsys`` console script: help texts, reports, and clear errors for bad input."""

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()


@pytest.mark.parametrize(
    "args",
    [[], ["prepare"], ["train"], ["eval"], ["serve"], ["recommend"], ["demo"], ["bench"], ["bench", "recall"],
     ["bench", "serve"], ["bench", "llm"], ["bench", "llm-probe"]],
)
def test_every_command_has_help(args):
    res = runner.invoke(app, [*args, "--help"])
    assert res.exit_code == 0, res.output
    assert "Usage" in res.output


def test_bad_config_is_refused_naming_the_key(tmp_path: Path):
    cfg = tmp_path / "p.yaml"
    cfg.write_text("pipeline:\n  stages:\n    - {name: recall, kind: recall, depth: -3, on_error: fail}\n")
    res = runner.invoke(app, ["prepare", "--config", str(cfg)])
    assert res.exit_code == 2
    assert "pipeline.stages.0.depth" in res.output


def test_an_out_path_that_is_a_directory_is_refused_before_any_work(tmp_path: Path):
    # it used to be found only when the report was written, after the whole split was
    res = runner.invoke(app, ["prepare", "--artifacts", str(tmp_path / "a"), "--out", str(tmp_path)])
    assert res.exit_code == 2 and "is a directory" in res.output
    assert not (tmp_path / "a").exists()


def test_an_out_path_under_a_file_or_a_locked_folder_is_refused_before_any_work(tmp_path: Path):
    (tmp_path / "afile").write_text("x")
    res = runner.invoke(app, ["prepare", "--artifacts", str(tmp_path / "a"), "--out", str(tmp_path / "afile" / "r.json")])
    assert res.exit_code == 2 and f"{tmp_path / 'afile'} is a file, not a directory" in res.output
    assert not (tmp_path / "a").exists()
    deep = tmp_path / "afile" / "more" / "r.json"  # the nearest existing folder above is what counts
    res = runner.invoke(app, ["prepare", "--artifacts", str(tmp_path / "a"), "--out", str(deep)])
    assert res.exit_code == 2 and "is a file, not a directory" in res.output
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")  # mkdir would raise FileExistsError after the work
    res = runner.invoke(app, ["prepare", "--artifacts", str(tmp_path / "a"), "--out", str(tmp_path / "dangling" / "r.json")])
    assert res.exit_code == 2 and f"{tmp_path / 'dangling'} is a broken symbolic link" in res.output
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        res = runner.invoke(app, ["prepare", "--artifacts", str(tmp_path / "a"), "--out", str(locked / "r.json")])
        assert res.exit_code == 2 and "is not writable" in res.output
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("args", [["prepare", "--out"], ["ab", "analyze", "--out"], ["ab", "analyze", "--export"],
                                  ["ab", "analyze", "--report-dir"]])
def test_a_dash_for_standard_output_is_refused_rather_than_written_as_a_file_named_dash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]):
    events = _ab_events(tmp_path)
    monkeypatch.chdir(tmp_path)
    more = ["--artifacts", str(tmp_path / "a")] if args[0] == "prepare" else ["--events", str(events)]
    res = runner.invoke(app, [*args, "-", *more])
    _one_line_error(res, args[-1], "'-' is not a path here: give a file or folder name")
    assert not (tmp_path / "-").exists() and not (tmp_path / "a").exists()


@pytest.mark.parametrize("args", [["prepare", "--artifacts"], ["ab", "replay-dir", "--to"],
                                  ["bench", "llm", "--work-dir"]])
def test_a_dash_is_refused_as_a_folder_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, [*args, "-"])
    _one_line_error(res, args[-1], "'-' is not a folder here")
    assert not (tmp_path / "-").exists()


def test_unknown_stage_and_phase_are_refused(tmp_path: Path):
    res = runner.invoke(app, ["train", "recall,rerank", "--artifacts", str(tmp_path)])
    assert res.exit_code == 2 and "unknown stage(s) ['rerank']" in res.output
    res = runner.invoke(app, ["eval", "--phase", "train", "--artifacts", str(tmp_path)])
    assert res.exit_code == 2 and "'train' is not one of 'valid', 'test'" in res.output
    assert len(res.output.strip().splitlines()) == 1  # one line, no usage box, no traceback


def test_serve_and_recommend_need_trained_artifacts(tmp_path: Path):
    for args in (["serve"], ["recommend", "42"], ["bench", "llm-probe"]):
        res = runner.invoke(app, [*args, "--artifacts", str(tmp_path / "none")])
        assert res.exit_code == 2 and "no trained artifacts here" in res.output


def _one_line_error(res, *fragments: str) -> str:
    """The command refused with exit 2 and a single ``error:`` line naming the problem, no traceback."""
    assert res.exit_code == 2, res.output
    assert isinstance(res.exception, SystemExit), res.exception  # exited on purpose, nothing escaped
    [line] = [ln for ln in res.output.splitlines() if ln.strip()]
    assert line.startswith("error: ") and all(f in line for f in fragments), line
    return line


@pytest.fixture
def toy_artifacts(tmp_path: Path) -> Path:
    from tests.serving.toy import save_toy_split

    save_toy_split(tmp_path / "toy")
    return tmp_path / "toy"


def test_recommend_with_k_over_the_limit_is_one_line(toy_artifacts: Path) -> None:
    """`recsys recommend u0001 --k 1000` is one error line naming the limit, not a LimitError traceback."""
    res = runner.invoke(app, ["recommend", "u1", "--k", "1000", "--artifacts", str(toy_artifacts)])
    _one_line_error(res, "LimitError", "k:", "100")


def test_recommend_with_an_empty_user_id_is_one_line(toy_artifacts: Path) -> None:
    """`recsys recommend ''` is one error line, not a multi-line ValidationError traceback."""
    res = runner.invoke(app, ["recommend", "", "--artifacts", str(toy_artifacts)])
    _one_line_error(res, "ValueError", "invalid request: user_id:")


def test_recommend_without_a_trained_coarse_model_is_one_line(
    toy_artifacts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A missing coarse model is one error line naming the file, not a FileNotFoundError traceback."""
    from cascade.registry import STAGE_KINDS
    from tests.serving.toy import TOY_KINDS

    monkeypatch.setitem(STAGE_KINDS, "recall", TOY_KINDS["recall"])  # recall loads; coarse has no model
    cfg = tmp_path / "p.yaml"
    cfg.write_text("pipeline:\n  stages:\n    - {name: recall, kind: recall, on_error: fail}\n"
                   "    - {name: coarse, kind: coarse}\n")
    res = runner.invoke(app, ["recommend", "u1", "--config", str(cfg), "--artifacts", str(toy_artifacts)])
    _one_line_error(res, "FileNotFoundError", str(toy_artifacts / "coarse" / "meta.json"))


@pytest.mark.parametrize(("port", "bound"), [("70000", "less than or equal to 65535"),
                                           ("0", "greater than or equal to 1")])
def test_serve_refuses_a_port_out_of_range(toy_artifacts: Path, port: str, bound: str) -> None:
    """`recsys serve --port 70000` is refused by the option's bounds before anything starts (click's
    usage error, exit 2), rather than reaching uvicorn and dying with OverflowError.
    """
    res = runner.invoke(app, ["serve", "--port", port, "--artifacts", str(toy_artifacts)])
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    assert "Invalid value for '--port'" in res.output and bound in res.output



def test_serve_refuses_a_rule_set_this_catalog_cannot_judge(toy_artifacts: Path, tmp_path: Path) -> None:
    """A fail-closed rules stage whose rule set reads item categories the catalog lacks used to let the
    server start and answer 503 to every request; now `recsys serve` exits 2 before starting."""
    rules = tmp_path / "mine.yaml"
    rules.write_text("version: mine-1\nrules:\n  - {id: no_horror, kind: category_cap, max_items: 1, category: Horrorr}\n")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"rules: {{ruleset: {rules}}}\n")
    res = runner.invoke(app, ["serve", "--config", str(cfg), "--artifacts", str(toy_artifacts), "--port", "1"])
    _one_line_error(res, "stage 'rules'", "no_horror", "no item carries categories")


def test_tag_with_a_bad_prompt_document_is_one_line(toy_artifacts: Path, tmp_path: Path) -> None:
    bad = tmp_path / "prompt.yaml"
    bad.write_text("sytem: Rank these.\n")
    res = runner.invoke(app, ["tag", "--prompt", str(bad), "--artifacts", str(toy_artifacts)])
    _one_line_error(res, "'sytem': unknown key")


def _toy_pipeline_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str) -> Path:
    """A config file for the toy recall + rules pipeline (the registry pointed at the toy stages)."""
    from cascade.registry import STAGE_KINDS
    from tests.serving.toy import TOY_KINDS

    for kind, path in TOY_KINDS.items():
        monkeypatch.setitem(STAGE_KINDS, kind, path)
    cfg = tmp_path / "toy.yaml"
    cfg.write_text(f"pipeline:\n  {setting}\n  stages:\n"
                   "    - {name: recall, kind: recall, on_error: fail}\n    - {name: rules, kind: rules, on_error: fail}\n")
    return cfg


def test_recommend_whose_pipeline_cannot_answer_in_time_is_one_line(
    toy_artifacts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request budget of 1 ms: the required rules stage finds its deadline passed (HTTP answers 503)."""
    cfg = _toy_pipeline_config(tmp_path, monkeypatch, "request_budget_ms: 0.001")
    res = runner.invoke(app, ["recommend", "u1", "--config", str(cfg), "--artifacts", str(toy_artifacts)])
    assert res.exit_code == 1, res.output
    [line] = [ln for ln in res.output.splitlines() if ln.strip()]
    assert line.startswith("error: PipelineError: stage 'recall' failed: request deadline passed"), line


def test_bench_lists_counts_complete_and_short_lists_per_k(
    toy_artifacts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _toy_pipeline_config(tmp_path, monkeypatch, "max_k: 6")
    out = tmp_path / "lists.json"
    res = runner.invoke(app, ["bench", "lists", "--k", "1,3", "--config", str(cfg), "--artifacts", str(toy_artifacts),
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    # toy catalog, test phase: u1 and u3 have 3+ unseen items allowed; u2 (15) has m3 and m6 left, m4 is adult
    assert {k: (v["complete"], v["short"], v["empty"]) for k, v in report["k"].items()} == {"1": (3, 0, 0),
                                                                                        "3": (2, 1, 0)}
    bad = runner.invoke(app, ["bench", "lists", "--k", "0,3", "--config", str(cfg), "--artifacts", str(toy_artifacts)])
    _one_line_error(bad, "--k values must be in 1..6")


def _ab_events(tmp_path: Path) -> Path:
    from jobs.ab.events import export_parquet
    from tests.jobs.ab.test_analyze import hand_log

    return export_parquet(hand_log(), tmp_path / "events.parquet")


def test_ab_analyze_with_an_unreachable_redis_is_one_line() -> None:
    res = runner.invoke(app, ["ab", "analyze", "--redis-url", "redis://:s3cret@127.0.0.1:1", "--namespace", "x"])
    line = _one_line_error(res, "cannot reach Redis at redis://:***@127.0.0.1:1")
    assert "s3cret" not in line  # the password stays out of the message
    _one_line_error(runner.invoke(app, ["ab", "analyze", "--redis-url", "nope", "--namespace", "x"]),
                    "--redis-url nope")


@pytest.mark.parametrize(("expected", "fragment"), [
    ("control=nan,treatment=0.5", "finite"), ("control=inf,treatment=1", "finite"),
    ("control=-0.5,treatment=1.5", "finite and >= 0"), ("control=0,treatment=0", "positive"),
    ("control=1e308,treatment=1e308", "finite sum"), ("control=0.5,control=0.5", "twice"),
    ("=0.5", "name=share"), ("control", "name=share"),
])
def test_ab_analyze_refuses_bad_expected_shares_writing_nothing(tmp_path: Path, expected: str, fragment: str) -> None:
    out, export = tmp_path / "report.json", tmp_path / "export.parquet"
    res = runner.invoke(app, ["ab", "analyze", "--events", str(_ab_events(tmp_path)), "--expected", expected,
                              "--out", str(out), "--export", str(export)])
    _one_line_error(res, "--expected", fragment)
    assert not out.exists() and not export.exists()


@pytest.mark.parametrize("option", ["--out", "--export", "--report-dir"])
def test_ab_analyze_checks_every_output_path_before_reading_the_log(tmp_path: Path, option: str) -> None:
    (tmp_path / "afile").write_text("x")
    res = runner.invoke(app, ["ab", "analyze", "--events", str(_ab_events(tmp_path)),
                              option, str(tmp_path / "afile" / "x.out")])
    _one_line_error(res, option, "is a file, not a directory")


def test_ab_analyze_writes_strict_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import jobs.ab.analyze

    real = jobs.ab.analyze.analyze_events

    def with_undefined(*args, **kwargs):  # a number the analysis leaves undefined
        report = real(*args, **kwargs)
        report["arms"]["control"]["ctr"]["rate"] = float("nan")
        report["srm"]["chi2"] = float("inf")
        return report

    monkeypatch.setattr(jobs.ab.analyze, "analyze_events", with_undefined)
    out = tmp_path / "report.json"
    res = runner.invoke(app, ["ab", "analyze", "--events", str(_ab_events(tmp_path)),
                              "--expected", "control=0.5,treatment=0.5", "--out", str(out)])
    assert res.exit_code == 0, res.output

    def refuse(constant: str) -> None:
        raise AssertionError(f"report holds {constant}: not strict JSON")

    report = json.loads(out.read_text(), parse_constant=refuse)
    assert report["arms"]["control"]["ctr"]["rate"] is None and report["srm"]["chi2"] is None
    assert report["srm"]["expected"] == {"control": 2.5, "treatment": 2.5}


def test_serve_refuses_stages_trained_on_another_split_before_starting(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import serving.run
    from offline.protocol import make_split
    from offline.synthetic import generate

    started: list[Path] = []
    monkeypatch.setattr(serving.run, "serve", lambda settings, art, *args: started.append(art))
    make_split(generate(n_users=20, n_items=40, seed=1), k_core=1).save(tmp_path / "split")
    (tmp_path / "recall").mkdir()
    (tmp_path / "recall" / "stage.json").write_text('{"split_id": "0ld"}')
    res = runner.invoke(app, ["serve", "--artifacts", str(tmp_path)])
    _one_line_error(res, "stage(s) ['recall'] were trained on another split", "run `recsys train`")
    assert started == []  # used to start, and answer 503 to every request


def _fake_training_and_eval(monkeypatch: pytest.MonkeyPatch, empty_for_seeds: set[int]) -> list[int]:
    """Stand-ins for training and measuring (both eval paths call them): every fit hits the wall-clock
    cap, so it warns, and a seed in ``empty_for_seeds`` gives every user an empty list. Returns the
    seeds trained, in order."""
    import numpy as np

    import jobs.evaluation.evaluate
    import jobs.evaluation.seeds
    import jobs.train
    from jobs.evaluation.cascade_run import list_completeness

    trained: list[int] = []

    def train_stages(settings, art, split, **kwargs):
        trained.append(settings.seed)
        return {"recall": {"seconds": 1.0, "out_of_time": True, "epochs": 3}}

    def evaluate_pipeline(settings, art, split, **kwargs):
        served = np.full(split.n_users, 0 if settings.seed in empty_for_seeds else 10)
        return {"lists": list_completeness({"served": served, "short_reasons": {}}), "timings": {}}

    for module in (jobs.train, jobs.evaluation.seeds):
        monkeypatch.setattr(module, "train_stages", train_stages)
    for module in (jobs.evaluation.evaluate, jobs.evaluation.seeds):
        monkeypatch.setattr(module, "evaluate_pipeline", evaluate_pipeline)
    return trained


@pytest.mark.parametrize("seeds", [1, 3])
def test_eval_warns_and_fails_on_empty_lists_alike_with_one_seed_or_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seeds: int
) -> None:
    """README: eval "exits 1 when more than 1% get an empty list", after writing the report, and prints
    the training warnings. ``--seeds N`` used to skip both and exit 0; it now names the seeds at fault."""
    trained = _fake_training_and_eval(monkeypatch, empty_for_seeds={42, 43})
    out = tmp_path / "eval.json"
    args = ["eval", "--seeds", str(seeds), "--no-cold-items", "--synthetic-users", "40", "--synthetic-items", "80",
            "--artifacts", str(tmp_path / "art"), "--out", str(out)]
    res = runner.invoke(app, args)
    assert res.exit_code == 1, res.output
    assert trained == [42, 43, 44][:seeds]
    report = json.loads(out.read_text())  # written before the guard fails
    n = (report if seeds == 1 else report["per_seed"]["42"])["lists"]["users"]
    labels = [""] if seeds == 1 else ["seed 42: ", "seed 43: ", "seed 44: "]
    warnings = [ln for ln in res.stderr.splitlines() if ln.startswith("warning: ")]
    assert [w.partition("recall: the wall-clock cap")[0] for w in warnings] == [f"warning: {x}" for x in labels]
    [error] = [ln for ln in res.stderr.splitlines() if ln.startswith("error: ")]
    broken = f"{n} of {n} users (100.0%)"
    if seeds == 1:
        assert error.startswith(f"error: {broken} got an empty list (limit 1%); see 'lists' and 'policy_costs' in "
                                "the report: a rule probably"), error
    else:  # seed 44 kept its lists: only the two that broke the limit are named
        assert error.startswith(f"error: {broken} in seed 42, {broken} in seed 43 got an empty list (limit 1%); "
                                "see 'lists' and 'policy_costs' under 'per_seed' in the report"), error

    _fake_training_and_eval(monkeypatch, empty_for_seeds=set())
    res = runner.invoke(app, args)
    assert res.exit_code == 0 and "error:" not in res.stderr, res.output


def test_eval_with_seeds_runs_the_cold_item_protocol_once_for_the_first_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every shape of the robustness battery runs several seeds and needs the new-item slice: it is
    measured once, in the first seed's directory, and its warnings are that seed's."""
    import jobs.evaluation.cold_items

    _fake_training_and_eval(monkeypatch, empty_for_seeds=set())
    calls = []

    def cold_item_report(settings, art, split, **kwargs):
        calls.append((settings.seed, Path(art).name, kwargs["share"]))
        return {"slices": {}, "warnings": ["cold: a fit was budget-stopped"]}

    monkeypatch.setattr(jobs.evaluation.cold_items, "cold_item_report", cold_item_report)
    out = tmp_path / "eval.json"
    res = runner.invoke(app, ["eval", "--seeds", "2", "--cold-share", "0.2", "--synthetic-users", "40",
                              "--synthetic-items", "80", "--artifacts", str(tmp_path / "art"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert calls == [(42, "seed-42", 0.2)]
    report = json.loads(out.read_text())
    assert report["cold_items"]["warnings"] == ["cold: a fit was budget-stopped"]
    assert "warning: seed 42: cold: a fit was budget-stopped" in res.stderr
    assert "seed 43: cold" not in res.stderr


@pytest.mark.parametrize("seeds", ["1", "2"])
def test_eval_on_a_one_user_dataset_is_refused_before_any_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seeds: str
) -> None:
    """The paired bootstrap CIs need two users. It used to train every stage, then fail with scipy's
    "each sample in `data` must contain two or more observations"."""
    trained = _fake_training_and_eval(monkeypatch, empty_for_seeds=set())
    data = tmp_path / "solo"
    data.mkdir()
    (data / "items.csv").write_text("item_id,title,categories\n" + "".join(f"i{i},Title {i},A\n" for i in range(30)))
    (data / "interactions.csv").write_text("user_id,item_id,rating,timestamp\n"
                                           + "".join(f"solo,i{i},3,{1_600_000_000 + 100 * i}\n" for i in range(20)))
    res = runner.invoke(app, ["eval", "--seeds", seeds, "--no-cold-items", "--k-core", "1", "--data", str(data),
                              "--artifacts", str(tmp_path / "art")])
    _one_line_error(res, "eval needs at least 2 users for its paired bootstrap confidence intervals",
                    "dataset 'solo' has 1")
    assert trained == []


def test_loading_the_llm_libraries_under_the_cli_prints_nothing() -> None:
    """peft imports torchao, which logged four lines (kernels for CUDA and another Python that do not
    load, deprecated Enum registrations) before the output of every command that loads a model."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", "import cli.main, peft, transformers"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stderr == "", res.stderr
