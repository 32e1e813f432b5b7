"""New artifacts swapped in while serving (POST /admin/reload): refused when broken, atomic when good.

Toy catalog (``tests.serving.toy``): popularity recall, whose version is a digest of the
counts, so a reloaded split with other interactions shows up as a new ``recall`` version.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import httpx
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from cascade.registry import STAGE_KINDS
from offline.protocol import make_split
from serving.server_process import start_server_subprocess
from tests.reliability.conftest import ADMIN_KEY, RECALL, RULES
from tests.serving.toy import FailingStage, MissingArtifactsLLM, toy_dataset, toy_settings

KEY = {"X-API-Key": ADMIN_KEY}


def save_new_artifacts(artifact_dir: Path) -> None:
    """Retrained artifacts: the toy data plus three more views of m6 (so the counts change)."""
    ds = toy_dataset()
    extra = pd.DataFrame({"user_id": ["u1", "u1", "u2"], "item_id": ["m6", "m5", "m6"],
                          "rating": 4.0, "timestamp": [10, 11, 12]})
    ds.interactions = pd.concat([ds.interactions, extra], ignore_index=True)
    make_split(ds, k_core=1).save(artifact_dir / "split")


def recall_version(client: TestClient) -> str:
    resp = client.post("/v1/recommend", json={"user_id": "u1"})
    assert resp.status_code == 200, resp.text
    return resp.json()["versions"]["recall"]


def test_good_artifacts_are_swapped_in(admin_client: TestClient, toy_dir: Path) -> None:
    before = recall_version(admin_client)
    save_new_artifacts(toy_dir)
    assert recall_version(admin_client) == before  # nothing changes until the reload
    resp = admin_client.post("/admin/reload", headers=KEY)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["previous"]["recall"] == before and body["versions"]["recall"] != before
    assert recall_version(admin_client) == body["versions"]["recall"]
    # m6 is now the most viewed item u1 has not seen; it ranks first
    assert admin_client.post("/v1/recommend", json={"user_id": "u3"}).json()["cold_start"] is False


@pytest.mark.parametrize(("damage", "reason"), [
    ("garbage_items", "catalog unreadable"),
    ("missing_train", "catalog unreadable"),
    ("missing_split_json", "no saved split here"),
])
def test_corrupt_or_incomplete_artifacts_are_refused_and_old_ones_keep_serving(
    admin_client: TestClient, toy_dir: Path, damage: str, reason: str
) -> None:
    before = recall_version(admin_client)
    split = toy_dir / "split"
    if damage == "garbage_items":
        (split / "items.parquet").write_bytes(b"PAR1 this is not parquet")
    elif damage == "missing_train":
        (split / "train.parquet").unlink()
    else:
        (split / "split.json").unlink()
    resp = admin_client.post("/admin/reload", headers=KEY)
    assert resp.status_code == 422
    assert "reload refused, still serving the previous artifacts" in resp.json()["detail"]
    assert reason in resp.json()["detail"]
    assert recall_version(admin_client) == before


def test_a_split_prepared_again_without_retraining_is_refused(admin_client: TestClient, toy_dir: Path) -> None:
    # the recall stage records the split it was trained on; a new split beside it is another catalog
    import json

    from offline.split import split_id

    before = recall_version(admin_client)
    (toy_dir / "recall").mkdir(exist_ok=True)
    (toy_dir / "recall" / "stage.json").write_text(json.dumps({"split_id": split_id(toy_dir)}))
    save_new_artifacts(toy_dir)
    (toy_dir / "split" / "source.json").write_text('{"data": "new"}')
    resp = admin_client.post("/admin/reload", headers=KEY)
    assert resp.status_code == 422
    assert "stage(s) ['recall'] were trained on another split" in resp.json()["detail"]
    assert recall_version(admin_client) == before


def test_a_split_whose_first_user_no_request_can_name_reloads_with_a_cold_smoke_request(
    admin_client: TestClient, toy_dir: Path
) -> None:
    # a split saved before ids were bounded; the smoke request's own validation gave a 500
    ds = toy_dataset()
    long_id = "u" * 600
    ds.interactions["user_id"] = ds.interactions["user_id"].replace({"u1": long_id})
    ds.users["user_id"] = ds.users["user_id"].replace({"u1": long_id})
    make_split(ds, k_core=1).save(toy_dir / "split")
    resp = admin_client.post("/admin/reload", headers=KEY)
    assert resp.status_code == 200, resp.text
    assert admin_client.post("/v1/recommend", json={"user_id": "u3"}).json()["cold_start"] is False


def test_a_stage_that_fails_to_load_or_to_answer_is_refused(
    admin_client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = recall_version(admin_client)
    monkeypatch.setitem(STAGE_KINDS, "rules", MissingArtifactsLLM)
    resp = admin_client.post("/admin/reload", headers=KEY)
    assert resp.status_code == 422 and "stage 'rules' failed to load" in resp.json()["detail"]
    assert "FileNotFoundError" in resp.json()["detail"]
    monkeypatch.setitem(STAGE_KINDS, "rules", FailingStage)  # loads, then raises
    resp = admin_client.post("/admin/reload", headers=KEY)
    assert resp.status_code == 422 and "smoke request for user 'u1' failed" in resp.json()["detail"]
    assert "toy stage always fails" in resp.json()["detail"]
    assert recall_version(admin_client) == before


def test_reload_needs_the_admin_key(admin_client: TestClient) -> None:
    assert admin_client.post("/admin/reload").status_code == 401
    assert admin_client.post("/admin/reload", headers={"X-API-Key": "wrong"}).status_code == 401


@pytest.mark.slow
def test_swaps_under_load_fail_no_request(toy_dir: Path) -> None:
    """A real server under 4 concurrent clients: good, corrupt, then good artifacts again."""
    settings = toy_settings(RECALL, RULES, admin_api_key=ADMIN_KEY, result_cache_ttl_s=0)
    statuses: Counter[int] = Counter()
    versions: set[str] = set()
    stop = threading.Event()
    lock = threading.Lock()

    def client_loop(base: str) -> None:
        with httpx.Client(base_url=base, timeout=10) as http:
            while not stop.is_set():
                resp = http.post("/v1/recommend", json={"user_id": "u1"})
                with lock:
                    statuses[resp.status_code] += 1
                    if resp.status_code == 200:
                        versions.add(resp.json()["versions"]["recall"])

    with start_server_subprocess(settings, toy_dir, app_factory="tests.serving.toy:create_toy_app_from_env",
                                 ready_timeout_s=60) as base:
        threads = [threading.Thread(target=client_loop, args=(base,)) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            outcomes = []
            save_new_artifacts(toy_dir)
            outcomes.append(httpx.post(base + "/admin/reload", headers=KEY, timeout=30).status_code)
            (toy_dir / "split" / "users.parquet").write_bytes(b"\x00" * 64)
            outcomes.append(httpx.post(base + "/admin/reload", headers=KEY, timeout=30).status_code)
            save_new_artifacts(toy_dir)
            outcomes.append(httpx.post(base + "/admin/reload", headers=KEY, timeout=30).status_code)
        finally:
            stop.set()
            for t in threads:
                t.join()
    assert outcomes == [200, 422, 200]
    assert set(statuses) == {200} and statuses[200] > 20
    assert len(versions) == 2  # the original and the reloaded counts, nothing else
