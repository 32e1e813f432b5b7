"""Events against real servers: kept across a crash of Redis, and bounded under an anonymous flood.

``event_durability`` serves a trained artifact directory (real uvicorn, one worker, its own
supervised embedded Redis, an experiment on so events carry their arm), posts ``events``
events, kills the ``redis-server`` child with SIGKILL at once, waits for the supervisor to
restart it, and counts what the stream still holds and what `recsys ab analyze` says of it
(its ``event_stream`` counts and its warning, run as a user would run it). Twice: with the append-only file (the default: expected to keep
every event) and without it (``serving.redis_persist: false``: everything is lost, and the
figure is whether the loss is told, with its count).

``anonymous_flood`` posts click events from ``users`` made-up user ids for ``seconds``
seconds, from several threads, and compares the Redis state before and after: keys by kind,
used memory against the cap, evicted keys, the active rule and prompt versions. Twice: with
the default per-client rate limit (one client: most calls get 429) and with the limit off and a
small memory cap (``flood_cap_mb``), as a flood from many addresses would be.

The Redis of a server is found as its ``redis-server`` child process (its unix socket is on
the command line). State goes under ``work_dir`` (``serving.redis_state_dir``), never into
the artifact directory.

Deliberately left out: thresholds (the report records the figures).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import redis

from cascade.settings import Settings
from offline.split import Split
from recsys.event_ledger import LEDGER_NAME
from recsys.experiments import ExperimentsConfig
from serving.run import APP_FACTORY
from serving.server_process import start_server_subprocess

NAMESPACE = "reliability"
RECSYS = str(Path(sys.executable).with_name("recsys"))


def _settings(settings: Settings | None, state_dir: Path, **serving: Any) -> Settings:
    base = settings or Settings.from_yaml(None)
    cfg = base.serving.model_copy(update={"redis_state_dir": state_dir, "redis_namespace": NAMESPACE, **serving})
    return base.model_copy(update={"serving": cfg, "redis_url": None,
                                   "experiments": ExperimentsConfig(enabled=True, name="reliability")})


def redis_child(server_pid: int, not_pid: int | None = None) -> tuple[int, str] | None:
    """(pid, unix socket) of the running ``redis-server`` child of ``server_pid`` (other than ``not_pid``)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == not_pid:
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) != server_pid or fields[0] == "Z" or b"redis-server" not in argv[0]:
            continue
        if b"--unixsocket" in argv:  # as started
            return int(entry.name), argv[argv.index(b"--unixsocket") + 1].decode()
        title = b" ".join(argv).decode(errors="replace")  # as redis-server retitles itself: "... unixsocket:PATH"
        if "unixsocket:" in title:
            return int(entry.name), title.split("unixsocket:", 1)[1].split()[0]
    return None


def _wait(check: Any, timeout_s: float) -> Any:
    """Poll ``check()`` until it returns something truthy or ``timeout_s`` passes; its last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def _ping(socket: str) -> bool:
    try:
        return bool(redis.Redis(unix_socket_path=socket, socket_timeout=1).ping())
    except redis.exceptions.RedisError:
        return False


def _kill_redis(server_pid: int) -> dict[str, Any]:
    """SIGKILL the server's redis-server; wait for its restart. The new (pid, socket) and the seconds it took."""
    found = redis_child(server_pid)
    if found is None:
        raise RuntimeError(f"server {server_pid} has no redis-server child (is REDIS_URL set?)")
    killed, _ = found
    t0 = time.monotonic()
    subprocess.run(["kill", "-9", str(killed)], check=True)
    back = _wait(lambda: (c := redis_child(server_pid, not_pid=killed)) and _ping(c[1]) and c, 60.0)
    if not back:
        raise RuntimeError(f"the embedded Redis did not come back within 60 s after kill -9 of {killed}")
    return {"killed_pid": killed, "new_pid": back[0], "socket": back[1], "restart_s": round(time.monotonic() - t0, 3)}


def _post_events(url: str, users: list[str], items: list[str], n: int, tag: str) -> Counter[str]:
    rng = np.random.default_rng(0)
    codes: Counter[str] = Counter()
    with httpx.Client(base_url=url, timeout=10) as client:
        for i in range(n):
            body = {"event_id": f"{tag}-{i}", "user_id": users[int(rng.integers(len(users)))],
                    "item_id": items[int(rng.integers(len(items)))], "type": "click"}
            resp = client.post("/v1/events", json=body)
            codes[resp.json().get("status", str(resp.status_code)) if resp.status_code == 200
                  else str(resp.status_code)] += 1
    return codes


def _analyze(socket: str, ledger: Path | None, out: Path) -> dict[str, Any]:
    """`recsys ab analyze` on the server's Redis: exit code, its stderr lines, its ``event_stream`` counts."""
    cmd = [RECSYS, "ab", "analyze", "--redis-url", f"unix://{socket}", "--namespace", NAMESPACE, "--out", str(out)]
    if ledger is not None and ledger.exists():
        cmd += ["--ledger", str(ledger)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    lines = [line for line in run.stderr.splitlines() if line.startswith(("warning:", "error:"))]
    stream = json.loads(out.read_text()).get("event_stream") if run.returncode == 0 and out.exists() else None
    if stream is not None:
        stream.pop("lost_ranges", None)
    return {"exit_code": run.returncode, "lines": lines, "event_stream": stream}


def _durability_phase(artifact_dir: Path, run_dir: Path, settings: Settings | None, users: list[str],
                      items: list[str], events: int, persist: bool, app_factory: str) -> dict[str, Any]:
    state = run_dir / "state" / "redis"
    served = _settings(settings, state, redis_persist=persist, events_rate_per_s=0.0)
    with start_server_subprocess(served, artifact_dir, extra_env={"REDIS_URL": ""}, app_factory=app_factory) as url:
        server_pid = int(httpx.get(url + "/readyz", timeout=10).json()["pid"])
        codes = _post_events(url, users, items, events, f"durability-{int(persist)}")
        accepted = codes["accepted"]
        restart = _kill_redis(server_pid)  # at once: no second for an fsync to pass
        client = redis.Redis(unix_socket_path=restart["socket"], socket_timeout=5)
        key = f"{NAMESPACE}:events:added"
        _wait(lambda: int(client.get(key) or 0) >= accepted, 10.0)  # the server records what it lost first
        kept = int(client.xlen(f"{NAMESPACE}:events"))
        analysis = _analyze(restart["socket"], state.parent / LEDGER_NAME if persist else None,
                            run_dir / "analysis.json")
    return {
        "persisted": persist, "events_sent": events, "responses": dict(codes), "accepted": accepted,
        "kept": kept, "share_kept": round(kept / accepted, 6) if accepted else None,
        "warning_shown": any("are missing" in line for line in analysis["lines"]),
        "analyze": analysis, "restart": {k: v for k, v in restart.items() if k != "socket"},
    }


def event_durability(artifact_dir: Path, work_dir: Path, events: int = 1600, *, settings: Settings | None = None,
                     app_factory: str = APP_FACTORY) -> dict[str, Any]:
    """The durability figures of the module docstring, with and without the append-only file."""
    split = Split.load(Path(artifact_dir) / "split")
    users = [str(u) for u in split.vocab.user_ids]
    items = [str(i) for i in split.vocab.item_ids]
    runs = {name: _durability_phase(Path(artifact_dir), Path(work_dir) / name, settings, users, items, events,
                                    persist, app_factory)
            for name, persist in (("append_only_file", True), ("no_persistence", False))}
    return {"events": events, "namespace": NAMESPACE, **runs}


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else None if value is None else str(value)


def _snapshot(client: redis.Redis) -> dict[str, Any]:
    kinds: Counter[str] = Counter()
    for key in client.scan_iter(match=f"{NAMESPACE}:*", count=5_000):
        kinds[key.decode().removeprefix(f"{NAMESPACE}:").split(":")[0]] += 1
    memory, stats = client.info("memory"), client.info("stats")
    versions = {kind: _text(client.get(f"{NAMESPACE}:versions:{kind}:active")) for kind in ("rules", "prompts")}
    return {"keys": client.dbsize(), "keys_by_kind": dict(sorted(kinds.items())),
            "used_memory_mb": round(int(memory["used_memory"]) / 2**20, 3),
            "peak_memory_mb": round(int(memory["used_memory_peak"]) / 2**20, 3),
            "maxmemory_mb": round(int(memory["maxmemory"]) / 2**20, 3), "policy": memory["maxmemory_policy"],
            "evicted_keys": int(stats["evicted_keys"]), "active_versions": versions}


def _flood(url: str, items: list[str], seconds: float, users: int, threads: int) -> dict[str, Any]:
    codes: Counter[str] = Counter()
    lock, stop = threading.Lock(), time.monotonic() + seconds

    def sender(t: int) -> None:
        rng = np.random.default_rng(t)
        mine: Counter[str] = Counter()
        with httpx.Client(base_url=url, timeout=10) as client:
            n = 0
            while time.monotonic() < stop:
                body = {"event_id": f"flood-{t}-{n}", "user_id": f"anon-{int(rng.integers(users))}",
                        "item_id": items[int(rng.integers(len(items)))], "type": "click"}
                try:
                    mine[str(client.post("/v1/events", json=body).status_code)] += 1
                except httpx.TransportError as exc:
                    mine[type(exc).__name__] += 1
                n += 1
        with lock:
            codes.update(mine)

    workers = [threading.Thread(target=sender, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return {"seconds": seconds, "users": users, "threads": threads, "responses": dict(codes),
            "calls": sum(codes.values())}


def _flood_phase(artifact_dir: Path, run_dir: Path, settings: Settings | None, items: list[str], seconds: float,
                 users: int, threads: int, app_factory: str, **serving: Any) -> dict[str, Any]:
    served = _settings(settings, run_dir / "state" / "redis", **serving)
    with start_server_subprocess(served, artifact_dir, extra_env={"REDIS_URL": ""}, app_factory=app_factory) as url:
        ready = httpx.get(url + "/readyz", timeout=10).json()
        found = redis_child(int(ready["pid"]))
        if found is None:
            raise RuntimeError("the server has no redis-server child (is REDIS_URL set?)")
        client = redis.Redis(unix_socket_path=found[1], socket_timeout=10)
        before = _snapshot(client)
        flood = _flood(url, items, seconds, users, threads)
        after = _snapshot(client)
        still = httpx.post(url + "/v1/recommend", json={"user_id": "anon-0", "k": 5}, timeout=30).status_code
    cap = after["maxmemory_mb"]
    return {"serving": dict(serving), "flood": flood, "before": before, "after": after,
            "cap_held": after["used_memory_mb"] <= cap, "peak_within_cap": after["peak_memory_mb"] <= cap,
            "versions_intact": before["active_versions"] == after["active_versions"]
            and before["active_versions"]["rules"] is not None,
            "recommend_after_flood": still}


def anonymous_flood(artifact_dir: Path, work_dir: Path, seconds: float = 20, users: int = 10000, *,
                    settings: Settings | None = None, threads: int = 8, flood_cap_mb: int = 16,
                    app_factory: str = APP_FACTORY) -> dict[str, Any]:
    """The flood figures of the module docstring: the rate limit on, then off under a small memory cap."""
    split = Split.load(Path(artifact_dir) / "split")
    items = [str(i) for i in split.vocab.item_ids]
    limited = _flood_phase(Path(artifact_dir), Path(work_dir) / "rate_limited", settings, items, seconds, users,
                           threads, app_factory)
    unlimited = _flood_phase(Path(artifact_dir), Path(work_dir) / "unlimited_small_cap", settings, items, seconds,
                             users, threads, app_factory, events_rate_per_s=0.0, redis_maxmemory_mb=flood_cap_mb)
    return {"rate_limited": limited, "unlimited_small_cap": unlimited}
