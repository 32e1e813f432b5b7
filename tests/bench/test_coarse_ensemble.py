"""bench.coarse_ensemble: both orders of the A/B are timed on the same requests, and bad input is one line."""

from __future__ import annotations

import json

import pytest

from bench.coarse_ensemble import main, time_ensemble


def test_every_fit_and_the_first_alone_are_timed_on_the_same_requests(tiny_cascade, tmp_path) -> None:
    art, settings = tiny_cascade
    report = time_ensemble(art, settings, users=12)
    assert report["fits"] == 3 and report["requests"] == 12 and report["candidates_mean"] > 0
    assert set(report["coarse_ms"]) == {"every fit", "first fit"}
    assert all(0 < v["p50"] <= v["p90"] for v in report["coarse_ms"].values())
    out = tmp_path / "ensemble.json"
    main(["--artifacts", str(art), "--users", "4", "--out", str(out)])
    written = json.loads(out.read_text())
    assert "provenance" in written and written["runs"][str(art)]["requests"] == 4


def test_a_folder_without_a_trained_cascade_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--artifacts", str(tmp_path), "--out", str(tmp_path / "x.json")])
    assert stop.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
