"""What an operator sees when a trained file is damaged: the CLI's answer and a live server's.

``damaged_artifacts`` copies a trained artifact directory once per kind of damage (``DAMAGES``: a
truncated LightGBM model, a corrupt ``features.npz``, a corrupt two-tower ``model.pt``, a corrupt
faiss index, a missing file), then records

- ``recsys recommend`` on that copy (a real subprocess, so an abort or a segfault would show as
  its exit status): the exit code and the last line of its standard error;
- against a live server (``serving.server_process.start_server_subprocess``: real uvicorn, started once on a
  good copy), the damage applied under it: ``POST /admin/reload``'s status and detail, whether the
  next answer still comes from the previous versions, ``/readyz``'s status and body, and whether
  the process is still up; the file is then restored for the next case;
- a server started on a damaged copy (``first_load_failed``): ``/readyz`` while it cannot load, then
  ``POST /admin/reload`` once the file is restored, and ``/readyz`` after it.

Every file a stage loads is checked against the digest recorded at training before any native
library parses it (``recsys.manifest``), so each case is expected to read: exit 2 with one line
naming the file, a 422 naming it with the previous artifacts still served, ``/readyz`` 200.

Deliberately left out: judging the outcome (the report's reader does) and artifacts trained
before manifests existed (they load unverified, with a warning).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr

from cascade.settings import Settings
from offline.split import Split
from recsys.manifest import MANIFEST_FILE, MARKER_FILE, write_manifest
from serving.run import APP_FACTORY, server_env
from serving.server_process import REPO_ROOT, free_port, start_server_subprocess

ADMIN_KEY = "reliability-report-admin-key"


def _truncate(path: Path) -> None:
    """Keep the first half of the file: what a copy interrupted by a full disk leaves."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _corrupt(path: Path) -> None:
    """Overwrite 64 bytes in the middle: the length stays, the content does not."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes((b ^ 0xFF) for b in data[middle:middle + 64])
    path.write_bytes(bytes(data))


def _remove(path: Path) -> None:
    path.unlink()


# case -> (file under the artifact directory, what is done to it)
DAMAGES: dict[str, tuple[str, Callable[[Path], None]]] = {
    "truncated_lightgbm_model": ("coarse/model.txt", _truncate),
    "corrupt_features_npz": ("coarse/features.npz", _corrupt),
    "corrupt_two_tower_model_pt": ("recall/model.pt", _corrupt),
    "corrupt_faiss_index": ("recall/index/index.faiss", _corrupt),
    "missing_item_vectors": ("recall/item_vectors.npy", _remove),
}


def _copy(artifact_dir: Path, to: Path) -> Path:
    """A fresh copy of the trained artifacts at ``to`` (not ``state/``: a server's Redis data, not an artifact)."""
    shutil.rmtree(to, ignore_errors=True)
    shutil.copytree(artifact_dir, to, ignore=shutil.ignore_patterns("state"))
    return to


def damage(artifact_dir: Path, case: str) -> Path:
    """Apply ``DAMAGES[case]`` inside ``artifact_dir``; the damaged file."""
    relative, how = DAMAGES[case]
    path = Path(artifact_dir) / relative
    how(path)
    return path


def cli_outcome(artifact_dir: Path, user: str, config: Path | None) -> dict[str, Any]:
    """``recsys recommend <user>`` on ``artifact_dir``: exit code and last standard-error line."""
    cmd = [sys.executable, "-m", "cli.main", "recommend", user, "--k", "5", "--artifacts", str(artifact_dir),
           *(["--config", str(config)] if config is not None else [])]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=600)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return {"exit_code": done.returncode, "stderr_last_line": lines[-1] if lines else "",
            "stderr_lines": len(lines), "traceback": "Traceback" in done.stderr}


def _live_case(base_url: str, artifact_dir: Path, case: str, original: Path, user: str) -> dict[str, Any]:
    key = {"X-API-Key": ADMIN_KEY}
    body = {"user_id": user, "k": 5}
    before = httpx.post(f"{base_url}/v1/recommend", json=body, timeout=60).json()["versions"]
    path = damage(artifact_dir, case)
    try:
        reload = httpx.post(f"{base_url}/admin/reload", headers=key, timeout=300)
        after = httpx.post(f"{base_url}/v1/recommend", json=body, timeout=60)
        ready = httpx.get(f"{base_url}/readyz", timeout=30)
    finally:  # the next case starts from the good file
        shutil.copy2(original / DAMAGES[case][0], path)
    return {"reload_status": reload.status_code, "reload_detail": reload.json().get("detail"),
            "previous_still_served": after.status_code == 200 and after.json()["versions"] == before,
            "readyz_status": ready.status_code, "readyz": ready.json()}


def _first_load(settings: Settings, artifact_dir: Path, original: Path, case: str) -> dict[str, Any]:
    """A server started on ``artifact_dir`` damaged by ``case``: ``/readyz`` while it cannot load, then
    ``POST /admin/reload`` once the file is restored, and ``/readyz`` after it."""
    path = damage(artifact_dir, case)
    port = free_port()
    env = {**os.environ, **server_env(settings, artifact_dir), "PYTHONPATH": str(REPO_ROOT)}
    cmd = [sys.executable, "-m", "uvicorn", "--factory", APP_FACTORY, "--host", "127.0.0.1", "--port", str(port),
           "--log-level", "warning"]
    base_url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        failed = _poll_readyz(proc, base_url, lambda body: body.get("status") != "loading")
        shutil.copy2(original / DAMAGES[case][0], path)
        reload = httpx.post(f"{base_url}/admin/reload", headers={"X-API-Key": ADMIN_KEY}, timeout=300)
        ready = httpx.get(f"{base_url}/readyz", timeout=30)
        return {"case": case, "readyz_while_damaged": failed, "reload_after_fix_status": reload.status_code,
                "readyz_after_reload_status": ready.status_code, "process_alive": proc.poll() is None}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _poll_readyz(proc: subprocess.Popen, base_url: str, done: Callable[[dict[str, Any]], bool],
                 timeout_s: float = 300.0) -> dict[str, Any]:
    """``/readyz``'s status and body once ``done(body)``; the exit code instead if the process ends."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return {"exited": proc.returncode}
        try:
            resp = httpx.get(f"{base_url}/readyz", timeout=5)
            if done(resp.json()):
                return {"status": resp.status_code, "body": resp.json()}
        except httpx.HTTPError:
            pass  # not listening yet
        time.sleep(0.2)
    return {"timed_out_s": timeout_s}


def with_manifests(artifact_dir: Path, work_dir: Path) -> tuple[Path, list[str]]:
    """``artifact_dir``, or a copy under ``work_dir`` whose trained stages trained before digests were
    recorded (a ``stage.json``, no ``manifest.json``) get theirs, as the next ``recsys train`` would
    record them; the folders so recorded."""
    stages = sorted(p.parent for p in Path(artifact_dir).glob("**/" + MARKER_FILE)
                    if not (p.parent / MANIFEST_FILE).exists())
    if not stages:
        return Path(artifact_dir), []
    copy = Path(work_dir) / "source"
    shutil.rmtree(copy, ignore_errors=True)
    _copy(artifact_dir, copy)
    recorded = [str(stage.relative_to(artifact_dir)) for stage in stages]
    for stage in recorded:
        write_manifest(copy / stage)
    return copy, recorded


def damaged_artifacts(artifact_dir: Path, work_dir: Path, *, config: Path | None = None,
                      cases: tuple[str, ...] = tuple(DAMAGES)) -> dict[str, Any]:
    """Each damage ``case`` on copies of ``artifact_dir`` made under ``work_dir``: the CLI's and a live
    server's outcome (see the module docstring). ``config`` is the pipeline YAML the artifacts were
    trained with (default ``configs/pipeline.yaml``). Artifacts trained before digests were recorded
    are measured as the next ``recsys train`` leaves them (``with_manifests``; listed in the report)."""
    artifact_dir, work_dir = Path(artifact_dir), Path(work_dir)
    user = str(Split.load(artifact_dir / "split").vocab.user_ids[0])
    report: dict[str, Any] = {"artifact_dir": str(artifact_dir), "user": user, "cases": {}}
    artifact_dir, report["manifests_recorded_first"] = with_manifests(artifact_dir, work_dir)
    for case in cases:
        copy = _copy(artifact_dir, work_dir / f"cli-{case}")
        damage(copy, case)
        report["cases"][case] = {"file": DAMAGES[case][0], "recommend": cli_outcome(copy, user, config)}
        shutil.rmtree(copy, ignore_errors=True)
    settings = Settings.from_yaml(config)
    settings = settings.model_copy(update={"serving": settings.serving.model_copy(
        update={"admin_api_key": SecretStr(ADMIN_KEY)})})
    live = _copy(artifact_dir, work_dir / "live")
    with start_server_subprocess(settings, live) as base_url:
        for case in cases:
            try:
                report["cases"][case]["live"] = _live_case(base_url, live, case, artifact_dir, user)
            except httpx.HTTPError as exc:  # the server did not answer (it died): what the operator sees
                report["cases"][case]["live"] = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            report["server_alive_after_all_cases"] = httpx.get(f"{base_url}/healthz", timeout=10).status_code == 200
        except httpx.HTTPError:
            report["server_alive_after_all_cases"] = False
    report["first_load_failed"] = _first_load(settings, live, artifact_dir, cases[0])
    shutil.rmtree(live, ignore_errors=True)
    return report
