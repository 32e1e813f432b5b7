"""``serving.reliability.artifacts``: what the report records for damaged files, on a real tiny cascade."""

from __future__ import annotations

import shutil
from pathlib import Path

from cascade.settings import Settings
from recsys.manifest import MANIFEST_FILE
from serving.reliability.artifacts import damaged_artifacts
from tests.trained_cascade import write_config


def test_each_damaged_file_is_refused_by_name_and_the_server_keeps_serving(
        tiny_cascade: tuple[Path, Settings], tmp_path: Path) -> None:
    art = tmp_path / "synthetic"
    shutil.copytree(tiny_cascade[0], art)
    (art / "coarse" / MANIFEST_FILE).unlink()  # trained before digests: measured as `recsys train` leaves it
    cases = ("truncated_lightgbm_model", "missing_item_vectors")
    report = damaged_artifacts(art, tmp_path / "work", config=write_config(tmp_path / "tiny.yaml"), cases=cases)
    assert report["manifests_recorded_first"] == ["coarse"]
    for case in cases:
        got, file = report["cases"][case], report["cases"][case]["file"]
        assert got["recommend"]["exit_code"] == 2 and got["recommend"]["stderr_lines"] == 1
        assert file in got["recommend"]["stderr_last_line"] and not got["recommend"]["traceback"]
        assert got["live"]["reload_status"] == 422 and file in got["live"]["reload_detail"]
        assert got["live"]["previous_still_served"] and got["live"]["readyz_status"] == 200
    assert report["server_alive_after_all_cases"]
    first = report["first_load_failed"]
    assert first["readyz_while_damaged"]["status"] == 503
    assert first["readyz_while_damaged"]["body"]["damaged_file"].endswith("coarse/model.txt")
    assert (first["reload_after_fix_status"], first["readyz_after_reload_status"]) == (200, 200)
    assert not (art / "coarse" / MANIFEST_FILE).exists()  # the source is never written
    shutil.rmtree(tmp_path / "work", ignore_errors=True)
