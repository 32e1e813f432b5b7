"""``analyze_events`` on hand-made logs: exact CTRs and conversions, SRM, Parquet round trip, report."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from jobs.ab.analyze import analyze_events
from jobs.ab.events import events_frame, export_parquet, load_parquet
from jobs.ab.report import write_online_report
from jobs.ab.stats import two_proportion_ztest, wilson_interval


def ev(user: str, kind: str, variant: str | None, item: str = "m1") -> tuple[str, dict[str, str]]:
    fields = {"user_id": user, "item_id": item, "type": kind, "ts": "1.0", "experiment": "exp1"}
    if variant is not None:
        fields["variant"] = variant
    return "0-0", fields


def hand_log() -> pd.DataFrame:
    """control: u1, u2 see 4 items each (8 impressions), u1 clicks twice -> CTR 2/8, conversion 1/2.
    treatment: u3, u4, u5 see 2 each (6), u3 and u4 click once, u6 clicks unexposed (left out) -> CTR 2/6,
    conv 2/3.
    """
    rows = [ev(u, "impression", "control", f"m{i}") for u in ("u1", "u2") for i in range(4)]
    rows += [ev("u1", "click", "control"), ev("u1", "click", "control", "m2")]
    rows += [ev(u, "impression", "treatment", f"m{i}") for u in ("u3", "u4", "u5") for i in range(2)]
    rows += [ev("u3", "click", "treatment"), ev("u4", "click", "treatment"), ev("u6", "click", "treatment")]
    rows += [ev("u9", "rating", None)]
    return events_frame(rows)


def test_exact_ctr_and_conversion_per_arm() -> None:
    report = analyze_events(hand_log(), {"control": 0.5, "treatment": 0.5})
    c, t = report["arms"]["control"], report["arms"]["treatment"]
    assert (c["impressions"], c["clicks"], c["users_exposed"], c["users_converted"]) == (8, 2, 2, 1)
    assert (t["impressions"], t["clicks"], t["users_exposed"], t["users_converted"]) == (6, 2, 3, 2)
    assert (c["clicks_without_impression"], t["clicks_without_impression"]) == (0, 1)
    assert c["ctr"]["rate"] == 0.25 and t["ctr"]["rate"] == pytest.approx(1 / 3, abs=1e-6)
    assert c["conversion"]["rate"] == 0.5 and t["conversion"]["rate"] == pytest.approx(2 / 3, abs=1e-6)
    assert c["ctr"]["ci95"] == pytest.approx(list(wilson_interval(2, 8)), abs=1e-6)
    comp = report["comparisons"]["treatment"]["ctr"]
    z, p = two_proportion_ztest(2, 8, 2, 6)
    assert comp["diff"] == pytest.approx(1 / 3 - 1 / 4, abs=1e-6) and comp["relative_lift"] == pytest.approx(1 / 3, abs=1e-5)
    assert comp["z"] == pytest.approx(z, abs=1e-4) and comp["p_value"] == pytest.approx(p, abs=1e-6)
    assert report["control"] == "control"
    assert report["events_without_variant"] == 1
    assert report["experiments"] == ["exp1"]
    assert not report["srm"]["mismatch"]
    assert report["warnings"] == ["click(s) by users with no impression in their arm, left out of CTR and "
                                  "conversion: {'treatment': 1} (an impression logger down, bots, or clients "
                                  "naming another arm)"]


def test_clicks_without_impression_are_left_out_of_ctr_and_warned() -> None:
    # each arm 5 impressions (5 users), 0 clicks by them; treatment also 30 clicks by 30 users never shown
    # anything: the report said treatment CTR 1.0 (clamped), diff +1.0, p 0.0016, no warning
    rows = [ev(f"{arm[0]}{i}", "impression", arm) for arm in ("control", "treatment") for i in range(5)]
    rows += [ev(f"x{i}", "click", "treatment") for i in range(30)]
    report = analyze_events(events_frame(rows))
    t = report["arms"]["treatment"]
    assert (t["clicks"], t["clicks_without_impression"], t["ctr"]["rate"]) == (0, 30, 0.0)
    assert report["comparisons"]["treatment"]["ctr"]["diff"] == 0.0
    assert report["comparisons"]["treatment"]["ctr"]["p_value"] == 1.0
    assert any("{'treatment': 30}" in w for w in report["warnings"])


def test_more_clicks_than_impressions_is_no_rate_not_a_clamped_one() -> None:
    rows = [ev("c1", "impression", "control"), ev("c1", "click", "control")]
    rows += [ev("t1", "impression", "treatment")] + [ev("t1", "click", "treatment")] * 3
    report = analyze_events(events_frame(rows))
    assert report["arms"]["treatment"]["ctr"] == {"rate": None, "ci95": None}
    assert report["comparisons"]["treatment"]["ctr"] is None
    assert report["comparisons"]["treatment"]["conversion"]["diff"] == 0.0
    assert any("more clicks than impressions in {'treatment': '3 clicks / 1 impressions'}" in w
               for w in report["warnings"])


def test_a_log_of_the_holdout_alone_is_refused() -> None:
    rows = [ev("u1", "impression", "holdout"), ev("u1", "click", "holdout")]
    with pytest.raises(ValueError, match="no arm other than the holdout"):
        analyze_events(events_frame(rows))


def test_srm_warns_on_a_skewed_log() -> None:
    rows = [ev(f"c{i}", "impression", "control") for i in range(700)]
    rows += [ev(f"t{i}", "impression", "treatment") for i in range(300)]
    report = analyze_events(events_frame(rows), {"control": 0.5, "treatment": 0.5})
    assert report["srm"]["mismatch"] and report["srm"]["observed"] == {"control": 700, "treatment": 300}
    assert any("sample ratio mismatch" in w for w in report["warnings"])
    fair = analyze_events(events_frame(rows), {"control": 0.7, "treatment": 0.3})
    assert not fair["srm"]["mismatch"] and fair["warnings"] == []


def test_user_in_two_arms_is_flagged_and_control_must_exist() -> None:
    rows = [ev("u1", "impression", "control"), ev("u1", "impression", "treatment"), ev("u2", "impression", "control")]
    report = analyze_events(events_frame(rows))
    assert report["users_in_multiple_arms"] == 1 and report["srm"] is None
    with pytest.raises(ValueError, match="control 'nope' has no events"):
        analyze_events(events_frame(rows), control="nope")
    with pytest.raises(ValueError, match="carries a variant"):
        analyze_events(events_frame([ev("u1", "click", None)]))


def test_one_person_logged_under_two_unicode_spellings_is_one_user(tmp_path: Path) -> None:
    # a log spanning the change to NFC ids: the NFD events came before, the NFC ones after, in
    # another arm (assignment hashes the id); as two users the arm change went unflagged
    rows = [ev("Jose\u0301", "impression", "control"), ev("Jos\u00e9", "impression", "treatment")]
    pd.DataFrame([fields for _, fields in rows]).to_parquet(tmp_path / "e.parquet")  # an export from before
    for log in (events_frame(rows), load_parquet(tmp_path / "e.parquet")):
        assert log["user_id"].tolist() == ["Jos\u00e9"] * 2
        assert analyze_events(log)["users_in_multiple_arms"] == 1


def test_parquet_round_trip_and_report(tmp_path: Path) -> None:
    log = hand_log()
    loaded = load_parquet(export_parquet(log, tmp_path / "events.parquet"))
    assert analyze_events(loaded)["arms"] == analyze_events(log)["arms"]
    md = write_online_report(analyze_events(loaded, {"control": 0.5, "treatment": 0.5}), tmp_path / "rep")
    text = md.read_text()
    assert "| control | 8 | 2 | 0.25 |" in text and "no mismatch" in text
    png = tmp_path / "rep" / "online_rates.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 200_000


def test_cli_analyze_from_parquet(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from cli.main import app

    events = export_parquet(hand_log(), tmp_path / "events.parquet")
    out = tmp_path / "report.json"
    skew = CliRunner().invoke(app, ["ab", "analyze", "--events", str(events), "--expected", "control=0.9,treatment=0.1",
                                    "--out", str(out), "--report-dir", str(tmp_path / "md")])
    assert skew.exit_code == 0, skew.output
    report = json.loads(out.read_text())
    assert report["arms"]["treatment"]["ctr"]["rate"] == pytest.approx(1 / 3, abs=1e-6)
    assert "warning: click(s) by users with no impression" in skew.stderr
    assert (tmp_path / "md" / "online.md").exists()
    bad = CliRunner().invoke(app, ["ab", "analyze", "--out", str(out)])
    assert bad.exit_code == 2 and "exactly one of --redis-url" in bad.output
    holdout = export_parquet(events_frame([ev("u1", "impression", "holdout"), ev("u1", "click", "holdout")]),
                             tmp_path / "holdout.parquet")
    alone = CliRunner().invoke(app, ["ab", "analyze", "--events", str(holdout)])
    assert alone.exit_code == 2, alone.output
    assert alone.stderr.strip().splitlines() == ["error: analyze_events: no arm other than the holdout ('holdout') "
                                                 "has events; nothing to compare"]


def test_nan_expected_shares_are_refused_not_a_silent_pass() -> None:
    with pytest.raises(ValueError, match="finite"):
        analyze_events(hand_log(), {"control": float("nan"), "treatment": 0.5})


def test_strict_json_replaces_undefined_numbers() -> None:
    import json

    import numpy as np

    from cli.common import strict_json

    raw = {"a": float("nan"), "b": (1.5, np.float64("-inf")), "c": np.arange(2), "d": {"e": np.float32("nan")},
           "f": None, "g": "nan"}
    clean = strict_json(raw)
    assert clean == {"a": None, "b": [1.5, None], "c": [0, 1], "d": {"e": None}, "f": None, "g": "nan"}
    json.dumps(clean, allow_nan=False)  # would raise on any NaN or infinity left


def test_export_is_atomic(tmp_path: Path) -> None:
    path = export_parquet(hand_log(), tmp_path / "events.parquet")
    before = path.read_bytes()

    class Broken(pd.DataFrame):
        def to_parquet(self, target, *args, **kwargs):  # type: ignore[override]
            if hasattr(target, "write"):
                target.write(b"PAR1 half")
            else:
                Path(target).write_bytes(b"PAR1 half")
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        export_parquet(Broken(hand_log()), path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["events.parquet"]
