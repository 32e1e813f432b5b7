"""Rule versions under stress, against real servers: mixed answers under publishes, reverts after a Redis crash.

``concurrent_publish`` serves a copy of a trained artifact directory (real uvicorn, one worker,
its own embedded Redis) and publishes two rule sets in turn every 50 ms while client threads
ask for recommendations. Both rule sets are the served one plus one marker: A blocks item X
(the item most often first in the answers before the run), B attaches a disclaimer to every
item seen in those answers. Every answer is checked against the version it is labelled with:
under A, X never appears and no item carries B's disclaimer; under B, every one of those items
carries it. The count of answers that disagree is the figure (expected: 0).

``publish_then_kill`` runs ``recsys serve --workers 2`` (its embedded, supervised Redis) on a
copy, and per trial publishes a new rule set, kills the ``redis-server`` child with SIGKILL at
once, waits for the supervisor to restart it, and then
samples ``/readyz`` on fresh connections until both workers answered: a trial *reverted* when a
worker still serves another version once the allowance is over (expected: 0 of ``trials``). It
runs with ``serving.redis_persist`` off by default, so the restarted Redis is empty and what keeps
the version is the workers' activation sequences (``serving.document_reload``), not the append-only file.

Deliberately left out: writing the report (``serving.reliability.report``).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from cascade.settings import Settings
from offline.split import Split
from recsys.documents import read_document
from serving.server_process import REPO_ROOT, free_port, start_server_subprocess

PUBLISH_EVERY_S = 0.05
NOTE = "Reliability check: rule set B."
CLIENT_THREADS = 4
CONVERGE_S = 20.0  # how long the workers get, after Redis answers again, to serve the published version


def _copy(artifact_dir: Path, work_dir: Path) -> Path:
    dest = Path(work_dir) / "artifacts" / Path(artifact_dir).resolve().name
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(artifact_dir, dest)
    return dest


def _served_rules(settings: Settings) -> dict[str, Any]:
    """The rule set document the server starts on (the configured file, or the packaged default)."""
    return read_document(settings.rules.ruleset_path(), "rule set file")


def _users(artifact_dir: Path, n: int = 200) -> list[str]:
    return [str(u) for u in Split.load(artifact_dir / "split").users["user_id"].head(n)]


def marked_rule_sets(base: dict[str, Any], block: str, noted: list[str], tag: str) -> tuple[dict, dict]:
    """A (``base`` + a blocklist of ``block``) and B (``base`` + ``NOTE`` on ``noted``, dropping A's
    blocklist knowingly); both keep every gate of ``base``."""
    rules = list(base.get("rules", []))
    a = {**base, "version": f"reliability-a-{tag}", "rules": [
        *rules, {"id": "reliability_block", "kind": "blocklist", "items": {"item_ids": [block]}}]}
    b = {**base, "version": f"reliability-b-{tag}", "acknowledge_dropped_gates": ["blocklist:reliability_block"],
         "rules": [*rules, {"id": "reliability_note", "kind": "disclaimer", "text": NOTE,
                            "items": {"item_ids": noted}}]}
    return a, b


def disagreement(answer: dict[str, Any], a: str, b: str, block: str, noted: set[str]) -> str | None:
    """Why ``answer`` disagrees with the rule set it is labelled with (A or B), or None."""
    version = answer.get("versions", {}).get("rules")
    items = {i["id"]: i.get("disclaimers", []) for i in answer.get("items", [])}
    if version == a:
        if block in items:
            return f"labelled {a} but holds {block!r}, which it blocks"
        if any(NOTE in d for d in items.values()):
            return f"labelled {a} but carries {b}'s disclaimer"
    elif version == b:
        if missing := [i for i, d in items.items() if i in noted and NOTE not in d]:
            return f"labelled {b} but {missing[0]!r} lacks its disclaimer"
    else:
        return f"labelled {version!r}, neither {a} nor {b}"
    return None


def concurrent_publish(artifact_dir: Path, work_dir: Path, requests: int = 10000) -> dict[str, Any]:
    """Publish A and B in turn every 50 ms while ``CLIENT_THREADS`` clients send ``requests`` in all."""
    copy = _copy(artifact_dir, work_dir)
    key = secrets.token_hex(16)
    settings = Settings.build({"serving": {"admin_api_key": key}})
    users = _users(copy)
    auth = {"X-API-Key": key}
    with start_server_subprocess(settings, copy) as url, httpx.Client(base_url=url, timeout=30) as http:
        before = [http.post("/v1/recommend", json={"user_id": u, "k": 10}).json() for u in users]
        firsts = Counter(a["items"][0]["id"] for a in before if a.get("items"))
        block = firsts.most_common(1)[0][0]
        noted = sorted({i["id"] for a in before for i in a.get("items", [])} - {block})
        doc_a, doc_b = marked_rule_sets(_served_rules(settings), block, noted, f"{int(time.time())}")
        first = http.put("/admin/rules", content=json.dumps(doc_a), headers=auth)
        if first.status_code != 200:
            raise RuntimeError(f"publishing rule set A failed: {first.status_code} {first.text}")
        stop, lock = threading.Event(), threading.Lock()
        publishes: Counter[int] = Counter()
        labels: Counter[str] = Counter()
        mixed: list[str] = []

        def publish() -> None:
            with httpx.Client(base_url=url, timeout=30) as c:
                turn = 0
                while not stop.is_set():
                    doc = (doc_b, doc_a)[turn % 2]
                    publishes[c.put("/admin/rules", content=json.dumps(doc), headers=auth).status_code] += 1
                    turn += 1
                    stop.wait(PUBLISH_EVERY_S)

        def ask(n: int, offset: int) -> None:
            with httpx.Client(base_url=url, timeout=30) as c:
                for j in range(n):
                    answer = c.post("/v1/recommend", json={"user_id": users[(offset + j) % len(users)], "k": 10}).json()
                    why = disagreement(answer, doc_a["version"], doc_b["version"], block, set(noted))
                    with lock:
                        labels[str(answer.get("versions", {}).get("rules"))] += 1
                        if why is not None:
                            mixed.append(why)

        t0 = time.perf_counter()
        publisher = threading.Thread(target=publish, daemon=True)
        publisher.start()
        askers = [threading.Thread(target=ask, args=(requests // CLIENT_THREADS, k * 37), daemon=True)
                  for k in range(CLIENT_THREADS)]
        for t in askers:
            t.start()
        for t in askers:
            t.join()
        stop.set()
        publisher.join()
        wall_s = time.perf_counter() - t0
    return {"requests": sum(labels.values()), "mixed_answers": len(mixed), "examples": mixed[:5],
            "answers_by_version": dict(labels), "publishes": {str(k): v for k, v in publishes.items()},
            "publish_every_s": PUBLISH_EVERY_S, "client_threads": CLIENT_THREADS, "wall_s": round(wall_s, 1),
            "blocked_item": block, "noted_items": len(noted)}


def _children(pid: int, name: str) -> list[int]:
    """Pids of ``pid``'s child processes whose command is ``name`` (read from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm = text[text.index("(") + 1:text.rindex(")")]
        ppid = int(text[text.rindex(")") + 2:].split()[1])
        if ppid == pid and comm == name:
            out.append(int(stat.parent.name))
    return out


def sample_workers(url: str, want: str, timeout_s: float) -> dict[int, list[str]]:
    """pid -> rules versions from fresh ``/readyz`` calls until two workers each answered twice with
    ``want``, or ``timeout_s``; the last answers tell what each worker serves."""
    seen: dict[int, list[str]] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with httpx.Client(timeout=5) as c:  # a new connection each time, so both workers answer
                ready = c.get(url + "/readyz")
        except httpx.HTTPError:
            continue
        if ready.status_code == 200:
            body = ready.json()
            seen.setdefault(body["pid"], []).append(body["versions"].get("rules", ""))
        settled = [pid for pid, vs in seen.items() if vs[-2:] == [want, want]]
        if len(settled) >= 2:
            break
        time.sleep(0.02)
    return seen


def _start_workers(copy: Path, work_dir: Path, key: str, persist: bool) -> tuple[subprocess.Popen, str, Any]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "RECSYS_REDIS_URL")}
    env["RECSYS_SERVING__ADMIN_API_KEY"] = key
    env["RECSYS_SERVING__REDIS_PERSIST"] = "true" if persist else "false"
    log_file = open(Path(work_dir) / "serve.log", "wb")  # noqa: SIM115 - closed by publish_then_kill
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--artifacts", str(copy), "--workers", "2",
                             "--port", str(port)], cwd=REPO_ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    pids: set[int] = set()
    while len(pids) < 2:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"recsys serve --workers 2 did not start: see {work_dir}/serve.log")
        try:
            ready = httpx.get(url + "/readyz", timeout=5)
            if ready.status_code == 200:
                pids.add(ready.json()["pid"])
        except httpx.HTTPError:
            time.sleep(0.2)
    return proc, url, log_file


def _trial(proc: subprocess.Popen, url: str, key: str, doc: dict[str, Any]) -> dict[str, Any]:
    """Publish ``doc``, SIGKILL the embedded Redis at once, wait for its restart, sample both workers."""
    put = httpx.put(url + "/admin/rules", content=json.dumps(doc), headers={"X-API-Key": key}, timeout=30)
    killed = _children(proc.pid, "redis-server")
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    while not (fresh := [p for p in _children(proc.pid, "redis-server") if p not in killed]):
        if time.monotonic() - t0 > 30:
            break
        time.sleep(0.01)
    restart_s = time.monotonic() - t0
    seen = sample_workers(url, doc["version"], CONVERGE_S)
    serving = {str(pid): versions[-1] for pid, versions in seen.items()}
    return {"put": put.status_code, "killed_redis": killed, "restarted_redis": fresh, "restart_s": round(restart_s, 3),
            "workers": serving, "settle_s": round(time.monotonic() - t0, 2),
            "reverted": put.status_code == 200 and (len(serving) < 2 or set(serving.values()) != {doc["version"]})}


def publish_then_kill(artifact_dir: Path, work_dir: Path, trials: int = 20, persist: bool = False) -> dict[str, Any]:
    """``trials`` publishes, each followed at once by a SIGKILL of the embedded Redis; count reverts.
    ``persist``: keep Redis's append-only file on (the served default); off, the restarted Redis is empty."""
    copy = _copy(artifact_dir, work_dir)
    key = secrets.token_hex(16)
    base = _served_rules(Settings.build({}))
    items = [str(i) for i in Split.load(copy / "split").items["item_id"].head(trials)]
    proc, url, log_file = _start_workers(copy, work_dir, key, persist)
    rows = []
    try:
        tag = f"{int(time.time())}"
        for i in range(trials):
            # each trial blocks another item: the last trial's block is dropped knowingly
            doc = {**base, "version": f"kill-{tag}-{i}",
                   "acknowledge_dropped_gates": [*base.get("acknowledge_dropped_gates", []), "blocklist:trial_block"],
                   "rules": [
                *base.get("rules", []), {"id": "trial_block", "kind": "blocklist", "items": {"item_ids": [items[i]]}}]}
            rows.append(_trial(proc, url, key, doc))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log_file.close()
    return {"trials": len(rows), "reverts": sum(r["reverted"] for r in rows),
            "publishes_ok": sum(r["put"] == 200 for r in rows), "workers": 2, "redis_persist": persist,
            "max_settle_s": max((r["settle_s"] for r in rows), default=0.0), "runs": rows}
