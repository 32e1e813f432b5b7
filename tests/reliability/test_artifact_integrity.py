"""Damaged trained files, for real: each is refused by name before any native library parses it.

A tiny cascade is trained once (the session's ``tiny_cascade``); each test damages a copy as
``serving.reliability.artifacts.DAMAGES`` does (a torn LightGBM model would abort the process if
parsed) and checks what the operator sees: ``recsys recommend`` and ``recsys serve`` exit 2 with
one line naming the file, ``POST /admin/reload`` answers 422 naming it while the previous artifacts
keep serving, and a worker whose first load failed says which file in ``/readyz`` and becomes ready
through ``POST /admin/reload`` once the file is restored.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from cascade.registry import trained_under_other_settings
from cascade.settings import Settings
from jobs.train import train_stages
from offline.split import Split
from recsys.manifest import MANIFEST_FILE
from serving.app import create_app
from serving.reliability.artifacts import DAMAGES, cli_outcome, damage
from serving.run import recommend_once
from serving.server_process import REPO_ROOT, free_port
from tests.trained_cascade import trained_with, write_config

KEY = "integrity-test-admin-key"


@pytest.fixture
def trained(tiny_cascade: tuple[Path, Settings]) -> tuple[Path, Settings]:
    return tiny_cascade  # read only: the tests damage ``copy``


@pytest.fixture
def copy(trained: tuple[Path, Settings], tmp_path: Path) -> Path:
    out = tmp_path / "synthetic"
    shutil.copytree(trained[0], out)
    return out


def first_user(art: Path) -> str:
    return str(Split.load(art / "split").vocab.user_ids[0])


def with_key(settings: Settings) -> Settings:
    return settings.model_copy(update={"serving": settings.serving.model_copy(
        update={"admin_api_key": SecretStr(KEY)})})


@pytest.mark.parametrize("case", list(DAMAGES))
def test_recommend_refuses_a_damaged_file_in_one_line(copy: Path, tmp_path: Path, case: str) -> None:
    path = damage(copy, case)
    out = cli_outcome(copy, first_user(copy), write_config(tmp_path / "tiny.yaml"))
    assert out["exit_code"] == 2, out
    assert out["stderr_lines"] == 1 and not out["traceback"], out
    assert str(path) in out["stderr_last_line"]


def test_serve_refuses_a_damaged_file_before_it_starts(copy: Path, tmp_path: Path) -> None:
    path = damage(copy, "truncated_lightgbm_model")
    cmd = [sys.executable, "-m", "cli.main", "serve", "--artifacts", str(copy), "--port", str(free_port()),
           "--config", str(write_config(tmp_path / "tiny.yaml"))]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and str(path) in lines[0], done.stderr


@pytest.fixture
def live(copy: Path, trained: tuple[Path, Settings]) -> Iterator[TestClient]:
    with TestClient(create_app(with_key(trained[1]), copy), raise_server_exceptions=False) as client:
        wait_for_load(client)
        yield client


def wait_for_load(client: TestClient) -> dict:
    for _ in range(600):
        body = client.get("/readyz").json()
        if body["status"] != "loading":
            return body
        time.sleep(0.1)
    raise AssertionError("artifacts never finished loading")


# numpy's zip reader and torch first: before digests, they failed without naming the file (LightGBM aborted)
@pytest.mark.parametrize("case", ["corrupt_features_npz", "corrupt_two_tower_model_pt", "missing_item_vectors",
                                  "corrupt_faiss_index", "truncated_lightgbm_model"])
def test_reload_refuses_a_damaged_file_and_the_previous_artifacts_keep_serving(
        live: TestClient, copy: Path, trained: tuple[Path, Settings], case: str) -> None:
    body = {"user_id": first_user(copy), "k": 5}
    before = live.post("/v1/recommend", json=body).json()
    path = damage(copy, case)
    resp = live.post("/admin/reload", headers={"X-API-Key": KEY})
    assert resp.status_code == 422 and str(path) in resp.json()["detail"], resp.text
    assert "still serving the previous artifacts" in resp.json()["detail"]
    after = live.post("/v1/recommend", json=body)
    assert after.status_code == 200 and after.json()["versions"] == before["versions"]
    assert [i["id"] for i in after.json()["items"]] == [i["id"] for i in before["items"]]
    ready = live.get("/readyz")
    assert ready.status_code == 200 and ready.json()["reload_refused"]["damaged_file"] == str(path)
    shutil.copy2(trained[0] / DAMAGES[case][0], path)
    assert live.post("/admin/reload", headers={"X-API-Key": KEY}).status_code == 200
    assert live.get("/readyz").json()["reload_refused"] is None


def test_a_worker_whose_first_load_failed_names_the_file_and_recovers_by_reload(
        copy: Path, trained: tuple[Path, Settings]) -> None:
    path = damage(copy, "corrupt_features_npz")
    with TestClient(create_app(with_key(trained[1]), copy), raise_server_exceptions=False) as client:
        failed = wait_for_load(client)
        assert failed["status"] == "failed" and failed["damaged_file"] == str(path)
        assert str(path) in failed["detail"] and client.get("/readyz").status_code == 503
        refused = client.post("/admin/reload", headers={"X-API-Key": KEY})
        assert refused.status_code == 422 and "nothing is served yet" in refused.json()["detail"]
        shutil.copy2(trained[0] / DAMAGES["corrupt_features_npz"][0], path)
        resp = client.post("/admin/reload", headers={"X-API-Key": KEY})
        assert resp.status_code == 200 and resp.json()["previous"] is None, resp.text
        assert client.get("/readyz").status_code == 200
        assert client.post("/v1/recommend", json={"user_id": first_user(copy), "k": 5}).status_code == 200


def test_artifacts_trained_before_digests_load_with_a_warning_and_train_records_them(
        copy: Path, trained: tuple[Path, Settings], caplog: pytest.LogCaptureFixture) -> None:
    for stage in ("recall", "coarse"):  # as training wrote them before manifests: no manifest, an older marker
        (copy / stage / MANIFEST_FILE).unlink()
        marker = json.loads((copy / stage / "stage.json").read_text())
        marker.pop("serving_config_id", None)
        (copy / stage / "stage.json").write_text(json.dumps(marker))
    with caplog.at_level(logging.WARNING, logger="recsys.manifest"):
        answer = recommend_once(trained[1], copy, first_user(copy), k=5)
    assert len(answer["items"]) == 5
    assert any("coarse" in r.getMessage() and "unverified" in r.getMessage() for r in caplog.records)
    report = train_stages(trained_with(), copy, Split.load(copy / "split"), progress=False)
    assert all(r.get("reused") for r in report.values())
    assert (copy / "coarse" / MANIFEST_FILE).is_file() and (copy / "recall" / MANIFEST_FILE).is_file()
    damage(copy, "truncated_lightgbm_model")
    with pytest.raises(ValueError, match="model.txt: damaged"):
        recommend_once(trained[1], copy, first_user(copy), k=5)


def test_a_training_budget_is_not_another_setting(trained: tuple[Path, Settings]) -> None:
    art, settings = trained
    assert trained_under_other_settings(settings, art) == []
    other = settings.model_copy(update={"recall": settings.recall.model_copy(update={"popularity_share": 0.3})})
    assert trained_under_other_settings(other, art) == ["recall"]
