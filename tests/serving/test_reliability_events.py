"""The events reliability runs at toy size against real server processes, and the report's runner."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from serving.reliability import events as reliability_events
from serving.reliability.report import Piece, run_piece, run_report
from tests.serving.conftest import RECALL, RULES
from tests.serving.toy import toy_settings

TOY_APP = "tests.serving.toy:create_toy_app_from_env"
REAL_RULES_APP = "tests.serving.toy:create_real_rules_app_from_env"  # rule versions live in Redis


def test_events_survive_a_kill_9_of_the_servers_redis_and_a_loss_is_told(toy_dir: Path, tmp_path: Path) -> None:
    """After a Redis crash most events were gone and `recsys ab analyze` said nothing."""
    result = reliability_events.event_durability(toy_dir, tmp_path, events=60, settings=toy_settings(),
                                                 app_factory=TOY_APP)
    kept = result["append_only_file"]
    assert (kept["accepted"], kept["kept"], kept["share_kept"], kept["warning_shown"]) == (60, 60, 1.0, False)
    assert kept["analyze"]["event_stream"]["missing"] == 0
    assert kept["restart"]["new_pid"] != kept["restart"]["killed_pid"]
    lost = result["no_persistence"]
    assert (lost["accepted"], lost["kept"], lost["warning_shown"]) == (60, 0, True)
    assert lost["analyze"]["exit_code"] == 2 and "60 are missing: 60 lost" in lost["analyze"]["lines"][0]


def test_an_anonymous_flood_keeps_redis_under_its_cap_with_the_versions(toy_dir: Path, tmp_path: Path) -> None:
    result = reliability_events.anonymous_flood(toy_dir, tmp_path, seconds=1.0, users=200, threads=2,
                                                settings=toy_settings(RECALL, RULES, events_rate_per_s=5, events_rate_burst=10),
                                                app_factory=REAL_RULES_APP)
    for phase in ("rate_limited", "unlimited_small_cap"):
        run = result[phase]
        assert run["cap_held"] and run["versions_intact"] and run["recommend_after_flood"] == 200
        assert run["after"]["policy"] == "volatile-lru" and run["after"]["keys"] > run["before"]["keys"]
    assert result["rate_limited"]["flood"]["responses"].get("429", 0) > 0
    assert "429" not in result["unlimited_small_cap"]["flood"]["responses"]
    assert result["unlimited_small_cap"]["after"]["maxmemory_mb"] == 16.0


def test_a_failing_run_is_recorded_and_an_absent_one_skipped(tmp_path: Path) -> None:
    broken = run_piece(Piece("events", "broken", "events", lambda m, w: {"n": 1 // 0}), tmp_path)
    assert broken["error"] == "ZeroDivisionError: integer division or modulo by zero" and broken["wall_s"] >= 0
    absent = run_piece(Piece("rules", "later", "no_such_run", lambda m, w: {}), tmp_path)
    assert absent == {"skipped": "serving.reliability.no_such_run is not installed"}


def test_the_report_refuses_unknown_groups(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown group\(s\) \['signals'\]"):
        run_report(tmp_path, only=["events", "signals"])
    res = CliRunner().invoke(app, ["bench", "reliability", "--artifacts", str(tmp_path), "--only", "signals"])
    assert res.exit_code == 2 and res.stderr.strip() == (
        "error: --only takes groups among rules, artifacts, events, comma-separated; got 'signals'")
    res = CliRunner().invoke(app, ["bench", "reliability", "--artifacts", str(tmp_path), "--only", "events"])
    assert res.exit_code == 2 and "no split here" in res.stderr
