"""Experiments in serving (toy app, real Redis): variant per user, logged impressions and clicks,
then replay -> Redis stream -> analysis end to end with exact counts."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient
from pydantic import Field

from cascade.registry import build_stage, check_trained_on_split
from cascade.settings import Settings
from jobs.ab.analyze import analyze_events
from jobs.ab.events import read_stream
from jobs.ab.simulate import check_loopback, replay_artifacts, simulate
from offline.protocol import make_split
from offline.split import Split
from recsys.config import StageSpec
from recsys.experiments import ExperimentsConfig, assign
from recsys.pipeline import Pipeline
from serving.app import create_app
from serving.service import variant_pipelines
from tests.serving.conftest import redis_env, redis_server, toy_pipeline  # noqa: F401 - fixtures
from tests.serving.toy import AudienceRules, PopularityRecall, YearRerank, save_toy_split, toy_dataset

PAIRS = [(StageSpec(name="recall", kind="recall", on_error="fail"), PopularityRecall),
         (StageSpec(name="llm", kind="llm"), YearRerank),
         (StageSpec(name="rules", kind="rules", on_error="fail"), AudienceRules)]
EXPERIMENT = {"enabled": True, "name": "llm-test", "salt": "t1",
              "variants": [{"name": "control", "share": 0.5},
                           {"name": "treatment", "share": 0.5, "overrides": {"llm": True}}]}


class ExperimentSettings(Settings):
    """Settings with the ``experiments`` section (until the root Settings carries it)."""

    experiments: ExperimentsConfig = Field(default_factory=ExperimentsConfig)


def app_client(artifact_dir: Path) -> TestClient:
    settings = ExperimentSettings.build({"pipeline": {"max_k": 5, "stages": [s.model_dump() for s, _ in PAIRS]},
                                         "experiments": EXPERIMENT})
    return TestClient(create_app(settings, artifact_dir, pipeline=toy_pipeline(artifact_dir, settings, PAIRS)))


def test_variant_in_answer_impressions_and_clicks(tmp_path: Path, redis_env: str) -> None:  # noqa: F811
    save_toy_split(tmp_path)
    cfg = ExperimentsConfig.model_validate(EXPERIMENT)
    with app_client(tmp_path) as client:
        for user in ("u1", "u2", "u3"):
            answer = client.post("/v1/recommend", json={"user_id": user, "k": 3}).json()
            arm = assign(cfg, user).variant
            assert (answer["experiment"], answer["variant"], answer["impressions_logged"]) == ("llm-test", arm, True)
            assert answer["path"] == ("llm" if arm == "treatment" else "light")
        body = {"event_id": "c1", "user_id": "u1", "item_id": "m5", "type": "click"}
        assert client.post("/v1/events", json=body).status_code == 200
    log = read_stream(redis.Redis.from_url(redis_env), tmp_path.name)
    imps = log[log["type"] == "impression"]
    assert len(imps) == 3 + 2 + 1  # unseen items left: u1 m4 m5 m6, u2 m3 m6, u3 m3
    assert imps.groupby("user_id")["variant"].first().to_dict() == {u: assign(cfg, u).variant for u in ("u1", "u2", "u3")}
    assert imps[imps["user_id"] == "u1"]["rank"].tolist() == [1, 2, 3]
    click = log[log["type"] == "click"].iloc[0]
    assert (click["variant"], click["experiment"]) == (assign(cfg, "u1").variant, "llm-test")  # derived


def test_replay_simulation_to_analysis(tmp_path: Path, redis_env: str) -> None:  # noqa: F811
    art = tmp_path / "art"
    split = save_toy_split(art)
    replay = replay_artifacts(art, tmp_path / f"{tmp_path.name}-replay")
    assert Split.load(replay / "split").test.tolist() == split.valid.tolist()
    with app_client(replay) as client:
        run = simulate("http://testserver", split, users=10, seconds=30, k=5, client=client)
    assert run["requests"] == 3 and run["events"] == {"click_sent": 3}  # every test item is shown
    report = analyze_events(read_stream(redis.Redis.from_url(redis_env), replay.name),
                            ExperimentsConfig.model_validate(EXPERIMENT).shares())
    arms = report["arms"]
    assert sum(a["impressions"] for a in arms.values()) == 4 + 3 + 2
    assert sum(a["clicks"] for a in arms.values()) == 3
    assert all(a["conversion"]["rate"] == 1.0 for a in arms.values())

    assert (run["targets_shown"], run["warnings"]) == (3, [])


def test_a_server_that_knows_the_test_items_gives_a_warning_not_a_silent_zero(tmp_path: Path,
                                                                               redis_env: str) -> None:  # noqa: F811
    # a server started on the artifact directory itself (not on replay-dir's output) never shows a test
    # item: the run has 0 clicks, and says why rather than read as an ordinary report
    art = tmp_path / "art"
    split = save_toy_split(art)
    with app_client(art) as client:
        run = simulate("http://testserver", split, users=10, seconds=30, k=5, client=client)
    assert (run["requests"], run["targets_shown"], run["events"]) == (3, 0, {})
    assert run["warnings"] == [
        "not one of the 3 answered lists (k=5) showed its user's test item, so nothing was clicked: a server "
        "started on the artifact directory itself knows the test items and never shows them; start it on "
        "`recsys ab replay-dir`'s output (else the model ranks no target in the top k). The impressions it "
        "logged are in the experiment's stream"]


def test_a_replay_split_as_the_targets_is_refused(tmp_path: Path, redis_env: str) -> None:  # noqa: F811
    # with the replay split every target is the valid item, which the user already has: refused, rather
    # than 0 clicks, exit 0, and the server's stream filled with click-less impressions
    from typer.testing import CliRunner

    from cli.main import app

    art = tmp_path / "art"
    save_toy_split(art)
    replay = replay_artifacts(art, tmp_path / f"{tmp_path.name}-replay")
    with app_client(replay) as client, pytest.raises(ValueError) as refused:
        simulate("http://testserver", Split.load(replay / "split"), users=10, seconds=30, k=5, client=client)
    assert str(refused.value) == (
        "simulate: the split given is a replay split (`recsys ab replay-dir`'s output: each user's test item is "
        "replaced by the valid one, which the server already knows), so no target could ever be clicked; give "
        "the original split (the artifact directory replay-dir was made from) and serve the replay directory")
    assert not redis.Redis.from_url(redis_env).exists(f"{replay.name}:events")  # refused before any request
    out = tmp_path / "sim.json"
    res = CliRunner().invoke(app, ["ab", "simulate", "--url", "http://127.0.0.1:1", "--artifacts", str(replay),
                                   "--users", "2", "--seconds", "5", "--out", str(out)])
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    assert res.stderr.strip().splitlines() == [
        f"error: {replay} is a replay directory (`recsys ab replay-dir` made it from {art.resolve()}): serve it, "
        f"and give the original as --artifacts ({art.resolve()}), whose test items are the targets"]
    assert not out.exists()


def test_replay_logs_the_events_of_users_whose_ids_hold_any_character(tmp_path: Path, redis_env: str) -> None:  # noqa: F811
    # event ids were built from the user id, so "José" or "ana maria" failed the event id pattern
    ds = toy_dataset()
    for frame in (ds.interactions, ds.users):
        frame["user_id"] = frame["user_id"].replace({"u1": "Jos\u00e9", "u2": "ana maria"})
    art = tmp_path / "art"
    split = make_split(ds, k_core=1)
    split.save(art / "split")
    replay = replay_artifacts(art, tmp_path / f"{tmp_path.name}-replay")
    with app_client(replay) as client:
        run = simulate("http://testserver", split, users=10, seconds=30, k=5, client=client)
    assert run["requests"] == 3 and run["events"] == {"click_sent": 3}


def test_a_replay_directory_in_the_artifact_directory_is_refused(tmp_path: Path) -> None:
    # the replay split (test hidden behind valid) was saved over the real one
    art = tmp_path / "art"
    split = save_toy_split(art)
    for to in (art, art / "replay", tmp_path / "art" / ".." / "art"):
        with pytest.raises(ValueError, match="is the artifact directory .*, inside it, or holds its split"):
            replay_artifacts(art, to)
    # a folder whose split is a link to the real one, and another dataset's artifact directory
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "split").symlink_to(art / "split", target_is_directory=True)
    with pytest.raises(ValueError, match="holds its split"):
        replay_artifacts(art, tmp_path / "linked")
    other = tmp_path / "other"
    save_toy_split(other)
    with pytest.raises(ValueError, match="holds a prepared split .*, not a replay"):
        replay_artifacts(art, other)
    assert Split.load(art / "split").test.tolist() == split.test.tolist()
    replay = replay_artifacts(art, tmp_path / "replay")
    assert replay_artifacts(art, replay) == replay  # a replay directory may be rebuilt


def test_a_replay_directory_keeps_the_split_identity_its_stages_were_trained_on(tmp_path: Path) -> None:
    # serving checks each stage's recorded split_id; a replay split without the original's source.json
    # had another identity, so `recsys serve` on it refused every trained stage
    import json

    from offline.split import split_id

    art = tmp_path / "art"
    save_toy_split(art)
    (art / "split" / "source.json").write_text(json.dumps({"data": "toy", "fingerprint": "abc"}))
    (art / "recall").mkdir()
    (art / "recall" / "stage.json").write_text(json.dumps({"split_id": split_id(art)}))
    replay = replay_artifacts(art, tmp_path / "replay")
    assert split_id(replay) == split_id(art)
    stages = [(StageSpec(name="recall", kind="recall"), PopularityRecall(StageSpec(name="recall", kind="recall"), None))]
    check_trained_on_split(Pipeline(stages), replay)  # raises StaleArtifacts on another identity


def test_analyze_with_a_wrong_namespace_names_the_streams_there(tmp_path: Path, redis_env: str) -> None:  # noqa: F811
    # an absent stream is named as absent, not read as an empty log ("none of the 0 events carries a variant")
    from typer.testing import CliRunner

    from cli.main import app

    url = f"{redis_env}?db=9"  # a database of its own: the session's other tests leave their streams in db 0
    client = redis.Redis.from_url(url)
    client.flushdb()
    for ns in ("shop1_replay", "other"):
        client.xadd(f"{ns}:events", {"type": "impression", "user_id": "u1", "item_id": "m1", "variant": "control"})
    client.set("not_a_stream:events", "x")
    with pytest.raises(ValueError) as missing:
        read_stream(client, "shop1")
    assert str(missing.value) == (
        "shop1:events does not exist: no events under namespace 'shop1'; the event streams here are "
        "other:events, shop1_replay:events (serving's namespace is serving.redis_namespace, by default the name "
        "of the artifact directory it was started on)")
    out = tmp_path / "an.json"
    res = CliRunner().invoke(app, ["ab", "analyze", "--redis-url", url, "--namespace", "shop1", "--out", str(out)])
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    assert res.stderr.strip().splitlines() == [f"error: Redis at {url}: {missing.value}"]
    assert not out.exists()
    assert len(read_stream(client, "shop1_replay")) == 1  # the right namespace reads as before
    client.flushdb()
    with pytest.raises(ValueError, match=r"^shop1:events does not exist: no events under namespace 'shop1', and no "
                                         r"\*:events stream at all here$"):
        read_stream(client, "shop1")
    client.close()


def test_analyze_with_a_namespace_holding_a_newline_is_one_error_line(tmp_path: Path,
                                                                      redis_env: str) -> None:  # noqa: F811
    # the namespace is quoted in the error, so `error:` stays one line
    from typer.testing import CliRunner

    from cli.main import app

    url = f"{redis_env}?db=10"
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.xadd("odd\nname:events", {"type": "impression", "user_id": "u1", "item_id": "m1", "variant": "control"})
    out = tmp_path / "an.json"
    res = CliRunner().invoke(app, ["ab", "analyze", "--redis-url", url, "--namespace", "shop1\nfoo", "--out", str(out)])
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    assert res.stderr.strip().splitlines() == [
        f"error: Redis at {url}: 'shop1\\nfoo:events' does not exist: no events under namespace 'shop1\\nfoo'; the "
        "event streams here are 'odd\\nname:events' (serving's namespace is serving.redis_namespace, by default the "
        "name of the artifact directory it was started on)"]
    assert not out.exists()
    client.set("shop2\nfoo:events", "not a stream")  # a key of another type: the same one line
    res = CliRunner().invoke(app, ["ab", "analyze", "--redis-url", url, "--namespace", "shop2\nfoo", "--out", str(out)])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.startswith(f"error: Redis at {url}: cannot read 'shop2\\nfoo:events': WRONGTYPE")
    client.flushdb()
    client.close()


def test_fusion_override_reweights_only_that_variant(tmp_path: Path) -> None:
    save_toy_split(tmp_path)
    fusion = StageSpec(name="fusion", kind="fusion")
    settings = ExperimentSettings.build({"pipeline": {"stages": [PAIRS[0][0].model_dump(), fusion.model_dump()]}})
    base = toy_pipeline(tmp_path, settings, [(PAIRS[0][0], PopularityRecall)])
    fused = build_stage(fusion, settings)
    base = Pipeline([*base.stages, (fusion, fused)])
    cfg = ExperimentsConfig.model_validate(
        {**EXPERIMENT, "variants": [{"name": "control", "share": 0.5},
                                    {"name": "b", "share": 0.5, "overrides": {"fusion_weights": {"recall": 1.0}}}]})
    out = variant_pipelines(base, cfg, settings)
    assert list(out) == ["b"]
    assert out["b"].stages[0][1] is base.stages[0][1]  # the loaded recall stage is shared
    assert out["b"].stage("fusion").config.weights == {"recall": 1.0}  # type: ignore[attr-defined]
    assert out["b"].versions()["fusion"] != base.versions()["fusion"]


def test_runs_never_share_event_ids_and_duplicates_are_not_counted_as_sent(tmp_path: Path,
                                                                          redis_env: str) -> None:  # noqa: F811
    # the run tag was the clock's second: a second run in that second reused every event id, the server
    # dropped its events as duplicates, and the simulator counted them as sent
    art = tmp_path / "art"
    split = save_toy_split(art)
    replay = replay_artifacts(art, tmp_path / f"{tmp_path.name}-replay")
    settings = ExperimentSettings.build({"pipeline": {"max_k": 5, "stages": [s.model_dump() for s, _ in PAIRS]}})
    app = create_app(settings, replay, pipeline=toy_pipeline(replay, settings, PAIRS))  # no experiment:
    with TestClient(app) as client:  # the simulator posts the impressions itself
        first = simulate("http://testserver", split, users=1, seconds=30, k=2, client=client)
        second = simulate("http://testserver", split, users=1, seconds=30, k=2, client=client)
        again = simulate("http://testserver", split, users=1, seconds=30, k=2, client=client,
                         run_tag=first["run_tag"])
    assert first["run_tag"] != second["run_tag"]
    assert first["events"]["impression_sent"] == 2 and second["events"]["impression_sent"] >= 1
    assert again["events"].get("impression_sent", 0) == 0 and again["events"]["impression_duplicate"] >= 1
    log = read_stream(redis.Redis.from_url(redis_env), replay.name)
    assert (log["type"] == "impression").sum() == first["events"]["impression_sent"] + second["events"]["impression_sent"]


def test_a_simulation_whose_every_request_is_refused_fails_naming_the_server_message(
        tmp_path: Path, redis_env: str) -> None:  # noqa: F811
    # k above the server's max_k: every answer was a 422, and the run reported success (exit 0)
    art = tmp_path / "art"
    split = save_toy_split(art)
    replay = replay_artifacts(art, tmp_path / f"{tmp_path.name}-replay")
    with app_client(replay) as client, pytest.raises(ValueError) as refused:
        simulate("http://testserver", split, users=10, seconds=30, k=1000, client=client)
    message = str(refused.value)
    assert message.startswith("simulate: every one of the 3 requests to http://testserver/v1/recommend was refused; "
                              "the first answer: HTTP 422: body.k: "), message
    assert "\n" not in message


def test_simulator_refuses_non_loopback() -> None:
    assert check_loopback("http://127.0.0.1:8000/") == "http://127.0.0.1:8000"
    with pytest.raises(ValueError, match="not a loopback"):
        check_loopback("http://example.com:8000")


def test_cli_simulate_with_no_server_listening_is_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    save_toy_split(tmp_path)
    out = tmp_path / "sim.json"
    res = CliRunner().invoke(app, ["ab", "simulate", "--url", "http://127.0.0.1:1", "--artifacts", str(tmp_path),
                                   "--users", "2", "--seconds", "5", "--out", str(out)])
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    [line] = [ln for ln in res.output.splitlines() if ln.strip()]
    assert line.startswith("error: cannot reach the server at http://127.0.0.1:1: ConnectError"), line
    assert not out.exists()
