"""Replay simulator: held-out users of a split drive a live server, producing a real event log.

Each simulated user is a real test user of the split, in a seeded random order. It asks
``POST /v1/recommend`` for ``k`` items; the server answers from the user's history as it
knows it (the split's train + valid sequence, seeded into Redis), which is exactly the test
phase's input. The user "clicks" a recommended item when it is the item they really
consumed next (their test target), and the click goes to ``POST /v1/events`` with the
variant the answer carried. Impressions: an experiment-enabled server logs them itself
(``impressions_logged`` in the answer); otherwise the simulator posts one impression event
per item shown, so the log is complete either way.

The server must not know the test items yet: serving's histories are a split's full
sequences (train + valid + test), and a known user never gets an item of them. Start it on
``replay_artifacts(artifact_dir, out_dir)``: the same trained stages (symlinked) over a copy
of the split whose test item is replaced by a repeat of the valid item, so what the server
knows ends where the test phase's input ends (every stage reads the same train + valid
interactions and popularity as in offline evaluation; only the served history shows the
valid item twice). Targets come from the original split.

Bounded by ``users`` and ``seconds``; refuses any URL that is not loopback, and a replay split
as the targets' source (its test items are the valid ones, which the server knows: nothing
could be clicked). A run in which every request was refused raises ``ValueError`` with the
server's message (nothing was measured); a run in which not one target was shown has a
warning in ``warnings`` (a server that knows the test items shows none of them). Event ids carry a random run tag, so two runs never share one; an event the
server reports as a duplicate is counted as ``<type>_duplicate``, not as sent.

Deliberately left out: position bias and click noise (a user clicks their true next item
wherever it is ranked) and users returning for a second session.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import numpy as np

from offline.split import Split
from recsys.atomic import atomic_write, atomic_write_json

REPLAY_MARKER = "replay.json"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def check_loopback(url: str) -> str:
    host = urlparse(url).hostname
    if host not in LOOPBACK:
        raise ValueError(f"simulate: {url!r} is not a loopback address ({sorted(LOOPBACK)}); refusing to drive it")
    return url.rstrip("/")


def replay_artifacts(artifact_dir: Path, out_dir: Path) -> Path:
    """A serving directory at ``out_dir``: ``artifact_dir``'s stages symlinked, the split's test hidden.

    The replay split keeps the original's identity (``source.json`` copied, same ``split.json``), so
    the stages pass serving's split check (``cascade.registry.check_trained_on_split``); ``replay.json``
    marks it, and ``out_dir`` may hold no other split: the replay's would be saved over it.
    """
    artifact_dir, out_dir = Path(artifact_dir).resolve(), Path(out_dir)
    resolved = out_dir.resolve()
    target = resolved / "split"
    if resolved == artifact_dir or artifact_dir in resolved.parents or \
            target.resolve() == (artifact_dir / "split").resolve():
        raise ValueError(f"replay directory {out_dir} is the artifact directory {artifact_dir}, inside it, or "
                         "holds its split; give another folder")
    if (target / "split.json").exists() and not (target / REPLAY_MARKER).exists():
        raise ValueError(f"replay directory {out_dir} holds a prepared split ({target}), not a replay; "
                         "give another folder")
    split = Split.load(artifact_dir / "split")
    out_dir.mkdir(parents=True, exist_ok=True)
    for entry in artifact_dir.iterdir():
        link = out_dir / entry.name
        if entry.name != "split" and entry.is_dir() and not link.exists():
            link.symlink_to(entry, target_is_directory=True)
    dataclasses.replace(split, test=split.valid.copy(), test_ts=split.valid_ts.copy()).save(out_dir / "split")
    source = artifact_dir / "split" / "source.json"
    if source.exists():
        atomic_write(out_dir / "split" / "source.json", lambda fh: fh.write(source.read_bytes()))
    atomic_write_json(out_dir / "split" / REPLAY_MARKER, {"replay_of": str(artifact_dir)})
    return out_dir


def replay_source(artifact_dir: Path) -> str | None:
    """The artifact directory ``artifact_dir``'s replay split was made from, or None when it is no replay."""
    marker = Path(artifact_dir) / "split" / REPLAY_MARKER
    if not marker.is_file():
        return None
    try:
        return str(json.loads(marker.read_text()).get("replay_of", "another directory"))
    except (OSError, ValueError, AttributeError):  # a damaged marker still marks a replay
        return "another directory"


def check_not_replay(split: Split) -> None:
    """``ValueError`` when ``split`` is a replay split: every test item is the valid one (``replay_artifacts``).

    A prepared split keeps one event per (user, item), so its test and valid items always differ.
    """
    if split.n_users and np.array_equal(split.targets("test"), split.targets("valid")):
        raise ValueError("simulate: the split given is a replay split (`recsys ab replay-dir`'s output: each "
                         "user's test item is replaced by the valid one, which the server already knows), so no "
                         "target could ever be clicked; give the original split (the artifact directory "
                         "replay-dir was made from) and serve the replay directory")


def simulate(
    base_url: str, split: Split, *, users: int = 500, seconds: float = 60.0, k: int = 10, seed: int = 0,
    run_tag: str | None = None, timeout_s: float = 30.0, client: httpx.Client | None = None,
) -> dict[str, Any]:
    """Replay up to ``users`` test users of ``split`` (the original) within ``seconds``; the run's counts.

    ``client`` (tests: a FastAPI ``TestClient``) replaces the loopback HTTP client.
    """
    base_url = check_loopback(base_url) if client is None else base_url
    if users < 1 or seconds <= 0 or k < 1:
        raise ValueError(f"simulate: need users >= 1, seconds > 0, k >= 1; got {users}, {seconds}, {k}")
    check_not_replay(split)
    tag = run_tag or f"sim-{uuid.uuid4().hex[:12]}"  # a clock tag repeats within a second: its events dropped
    order = np.random.default_rng(seed).permutation(split.n_users)[:users]
    targets = split.targets("test")
    counts: Counter[str] = Counter()
    variants: Counter[str] = Counter()
    refusal = ""  # the server's first non-200 answer
    stop_at = time.monotonic() + seconds
    t0 = time.perf_counter()
    http = client if client is not None else httpx.Client(base_url=base_url, timeout=timeout_s)
    try:
        for u in order:
            if time.monotonic() >= stop_at:
                counts["stopped_by_time"] = 1
                break
            user_id = str(split.vocab.user_ids[u])
            target_id = str(split.vocab.item_ids[targets[u]])
            resp = http.post("/v1/recommend", json={"user_id": user_id, "k": k})
            counts["requests"] += 1
            if resp.status_code != 200:
                counts[f"http_{resp.status_code}"] += 1
                refusal = refusal or f"HTTP {resp.status_code}: {server_message(resp)}"
                continue
            answer = resp.json()
            variant = answer.get("variant")
            variants[str(variant)] += 1
            shown = [item["id"] for item in answer["items"]]
            if not answer.get("impressions_logged"):
                for rank, item in enumerate(shown, 1):  # event ids by user index: an id may hold any character
                    _event(http, f"{tag}-u{u}-imp{rank}", user_id, item, "impression", variant, counts)
            if target_id in shown:
                counts["targets_shown"] += 1
                _event(http, f"{tag}-u{u}-click", user_id, target_id, "click", variant, counts)
    finally:
        if client is None:
            http.close()
    if counts["requests"] and not variants:
        raise ValueError(f"simulate: every one of the {counts['requests']} requests to {base_url}/v1/recommend "
                         f"was refused; the first answer: {refusal}")
    answered, shown_targets = sum(variants.values()), counts.pop("targets_shown", 0)
    return {"requests": counts.pop("requests", 0), "users_available": split.n_users, "variants": dict(variants),
            "targets_shown": shown_targets, "events": dict(counts), "wall_s": round(time.perf_counter() - t0, 2),
            "run_tag": tag, "warnings": [no_target_warning(answered, k)] if answered and not shown_targets else []}


def no_target_warning(answered: int, k: int) -> str:
    """The warning of a run whose ``answered`` lists (of ``k``) showed not one user's test target."""
    return (f"not one of the {answered} answered lists (k={k}) showed its user's test item, so nothing was "
            "clicked: a server started on the artifact directory itself knows the test items and never shows "
            "them; start it on `recsys ab replay-dir`'s output (else the model ranks no target in the top k). "
            "The impressions it logged are in the experiment's stream")


def _event(client: httpx.Client, event_id: str, user_id: str, item_id: str, kind: str, variant: str | None,
           counts: Counter[str]) -> None:
    body: dict[str, Any] = {"event_id": event_id, "user_id": user_id, "item_id": item_id, "type": kind}
    if variant is not None:
        body["variant"] = variant
    resp = client.post("/v1/events", json=body)
    if resp.status_code != 200:
        counts[f"{kind}_http_{resp.status_code}"] += 1
    else:
        counts[f"{kind}_{'duplicate' if resp.json().get('status') == 'duplicate' else 'sent'}"] += 1


def server_message(resp: httpx.Response, limit: int = 300) -> str:
    """The ``detail`` of an error answer on one line (each validation error as ``loc: msg``), at most ``limit`` chars."""
    try:
        detail = resp.json().get("detail", resp.text)
    except (ValueError, AttributeError):  # not JSON, or JSON that is not an object
        detail = resp.text
    if isinstance(detail, list):
        detail = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', []))}: {e.get('msg')}" if isinstance(e, dict)
                           else str(e) for e in detail)
    text = " ".join(str(detail).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
