"""Cold-start evaluation of new items: a time cutoff, a cascade trained without them, their slice.

Every other report averages over warm users of a k-core log, where item ids carry everything.
Here a cutoff time is chosen so that about ``share`` of the items first appear after it (first
appearance = the earliest interaction with the item anywhere in the log: train, valid or test).
Those items are *new*: every training step of a second cascade (recall, its channels, coarse,
fusion, LLM and tag adaptation) runs on a copy of the split whose train part has none of their
interactions, and the valid users whose valid item is new are left out of the steps that learn
from valid items (fusion tuning, the LLM's valid positives; ``Split.unseen_items``). At test
time a new item may still sit in a user's input history (an event the models never trained on),
as it would in production.

The slices, over that cascade's test requests: **cold item** (the user's test item is new), and
**warm item** (it is not). Per slice and stage: NDCG@10, Recall@10, users, and the paired CI of
each stage against the one before it (``jobs.evaluation.cascade_run.slice_table``). A new item can only be
recalled through what the cascade knows of it without interactions: its text (``recall.use_text``,
MiniLM), LLM tags, its LLM embedding; the report says which of those the configuration has on.

Artifacts of the cold cascade live in ``<artifact_dir>/cold-items/`` (their own split, reused
while the parent split and the share are unchanged).

Deliberately left out: new *users* (``jobs.evaluation.evaluate.short_history`` slices by history length).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from cascade.registry import build_pipeline
from cascade.settings import Settings
from jobs.evaluation.cascade_run import SCORED, memoised, requests_for_user, run_cascade, slice_table
from jobs.evaluation.evaluate import stage_candidate_recall
from jobs.evaluation.fit_report import training_warnings
from jobs.train import DEFAULT_STAGES, split_id, train_stages
from offline.metrics import candidates_found, per_user_metrics
from offline.split import Split, prepared_item_noun
from recsys.atomic import atomic_write_json

COLD_DIR = "cold-items"


def clockless(split: Split) -> bool:
    """True when the timestamps only order each user's events (positions 0, 1, 2, ... in the user's
    sequence, as datasets published without times carry them), so a global time cutoff means nothing.

    The test: every timestamp is a non-negative integer below twice the longest user sequence. Unix
    times (seconds or milliseconds), dates and days-since-start of any real log are far larger.

    >>> import pandas as pd
    >>> from types import SimpleNamespace as N
    >>> clockless(N(train=pd.DataFrame({"user_idx": [0, 0, 1], "timestamp": [0, 1, 0]}),
    ...             valid_ts=np.array([2, 1]), test_ts=np.array([3, 2])))
    True
    >>> clockless(N(train=pd.DataFrame({"user_idx": [0, 0], "timestamp": [881250949, 881251000]}),
    ...             valid_ts=np.array([881252000]), test_ts=np.array([881253000])))
    False
    """
    ts = np.concatenate([split.train["timestamp"].to_numpy(np.int64), np.asarray(split.valid_ts, np.int64),
                         np.asarray(split.test_ts, np.int64)])
    if len(ts) == 0:
        return False
    longest = int(np.bincount(split.train["user_idx"].to_numpy()).max()) + 2  # + the valid and test items
    return bool(ts.min() >= 0 and ts.max() < 2 * longest)


def first_seen(split: Split) -> np.ndarray:
    """Per item, the earliest timestamp of any interaction with it (train, valid, test); int64 max if none."""
    first = np.full(split.n_items, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, split.train["item_idx"].to_numpy(np.int64), split.train["timestamp"].to_numpy(np.int64))
    for items, ts in ((split.valid, split.valid_ts), (split.test, split.test_ts)):
        if len(ts) == len(items):
            ok = items >= 0
            np.minimum.at(first, items[ok], ts[ok].astype(np.int64))
    return first


def new_items(split: Split, share: float = 0.1) -> tuple[np.ndarray, int]:
    """(item indices first seen after the cutoff, the cutoff timestamp): about ``share`` of the items."""
    if not 0.0 < share < 1.0:
        raise ValueError(f"cold items: share must be in (0, 1), got {share}")
    first = first_seen(split)
    seen = first[first < np.iinfo(np.int64).max]
    if len(seen) == 0:
        raise ValueError("cold items: no item has an interaction")
    cutoff = int(np.quantile(seen, 1.0 - share, method="lower"))
    return np.flatnonzero((first > cutoff) & (first < np.iinfo(np.int64).max)).astype(np.int64), cutoff


def cold_split(split: Split, share: float = 0.1) -> Split:
    """``split`` without the train interactions of its new items; ``protocol['cold_items']`` says which."""
    items, cutoff = new_items(split, share)
    train = split.train[~split.train["item_idx"].isin(items)].reset_index(drop=True)
    protocol = {**split.protocol, "cold_items": {"share": share, "cutoff_ts": cutoff, "n_new": len(items),
                                                 "items": items.tolist(),
                                                 "dropped_train_interactions": int(len(split.train) - len(train))}}
    return dataclasses.replace(split, train=train, protocol=protocol, _seqs=None, _attrs=None)


def prepare_cold(artifact_dir: Path, split: Split, share: float = 0.1) -> tuple[Path, Split]:
    """(directory of the cold cascade, its split), saved once per parent split and share."""
    cold_dir = Path(artifact_dir) / COLD_DIR
    source = {"derived_from": split_id(Path(artifact_dir)), "cold_share": share,
              "item_noun": prepared_item_noun(Path(artifact_dir))}
    fp = cold_dir / "split" / "source.json"
    if fp.exists() and json.loads(fp.read_text()) == source and (cold_dir / "split" / "split.json").exists():
        return cold_dir, Split.load(cold_dir / "split")
    cold = cold_split(split, share)
    fp.unlink(missing_ok=True)  # as jobs.prepare.prepare: an interrupted rebuild leaves no split, never a mixed one
    cold.save(cold_dir / "split")
    atomic_write_json(fp, source)
    return cold_dir, cold


def cold_item_report(settings: Settings, artifact_dir: Path, split: Split, *, share: float = 0.1,
                     phase: str = "test", n_boot: int = 2000, progress: bool = True) -> dict[str, Any]:
    """Train the cold cascade (or reuse it) and measure every stage on the cold- and warm-item slices."""
    t0 = time.perf_counter()
    cold_dir, cold = prepare_cold(artifact_dir, split, share)
    trained = train_cold(settings, cold_dir, cold, progress)
    t1 = time.perf_counter()
    info = cold.protocol["cold_items"]
    return {
        "share": share, "cutoff_ts": info["cutoff_ts"], "new_items": info["n_new"], "of_items": cold.n_items,
        "dropped_train_interactions": info["dropped_train_interactions"],
        **measure_cold(settings, cold_dir, cold, phase=phase, n_boot=n_boot, progress=progress),
        "train_s": {k: v.get("seconds") for k, v in trained.items()},
        "seconds": {"train": round(t1 - t0, 1), "eval": round(time.perf_counter() - t1, 1)},
        "warnings": [f"cold-item cascade: {w}" for w in training_warnings(settings, trained)],
    }


def train_cold(settings: Settings, cold_dir: Path, cold: Split, progress: bool = True) -> dict[str, Any]:
    """Train (or reuse) the cold cascade's stages: the defaults, plus the LLM when the pipeline has one."""
    wanted = DEFAULT_STAGES + (("llm",) if any(s.enabled and s.kind == "llm" for s in settings.pipeline.stages)
                               else ())
    return train_stages(settings, cold_dir, cold, stages=wanted, progress=progress)


def item_side_knowledge(settings: Settings) -> dict[str, bool]:
    """What the pipeline knows of an item without interactions: its text (MiniLM in the item tower),
    LLM tags (coarse tag features: ``coarse.tag_features`` or a coarse stage on ``coarse_tags/``),
    its LLM embedding (a ``recall_llm`` stage)."""
    enabled = [s for s in settings.pipeline.stages if s.enabled]
    return {"text": bool(settings.recall.use_text),
            "llm_tags": bool(settings.coarse.tag_features)
            or any(s.kind == "coarse" and s.params.get("subdir") == "coarse_tags" for s in enabled),
            "llm_embedding": any(s.kind == "recall_llm" for s in enabled)}


def item_slices(cold: Split, targets: np.ndarray) -> dict[str, np.ndarray]:
    """Row indices of ``targets`` whose item is new (``cold_item``) or known (``warm_item``); rows
    without a target (-1) are in neither."""
    is_new = np.isin(targets, cold.unseen_items)
    return {"cold_item": np.flatnonzero(is_new), "warm_item": np.flatnonzero(~is_new & (targets >= 0))}


def measure_cold(settings: Settings, cold_dir: Path, cold: Split, *, phase: str = "test", n_boot: int = 2000,
                 progress: bool = True, per_user: dict[str, dict[str, np.ndarray]] | None = None,
                 users: np.ndarray | None = None) -> dict[str, Any]:
    """Run the pipeline of ``settings`` over the cold cascade's ``phase`` requests; per slice (cold item,
    warm item) and stage: NDCG@10, Recall@10, paired CIs, and the candidate recall of each stage that ran,
    keyed as the main report's (``recall@200``, ``jobs.evaluation.evaluate.stage_candidate_recall``).
    ``per_user``, when given, receives each slice's per-user NDCG@10 by stage, and per scored stage
    ``candidates:<stage>`` (1 when the target was among the candidates it received), for paired CIs
    between pipelines (``jobs.evaluation.cold_sources``). ``users`` (ascending user indices) measures only those
    users' requests, for a pipeline too slow to run every user (the LLM path, ``jobs.evaluation.cold_sources``)."""
    pipeline = memoised(build_pipeline(settings, cold_dir, phase=phase))  # type: ignore[arg-type]
    targets = cold.targets(phase)  # type: ignore[arg-type]
    requests, measured = None, None
    if users is not None:
        users = np.asarray(users, dtype=np.int64)
        requests = [requests_for_user(cold, int(u), phase) for u in users]  # type: ignore[arg-type]
        targets, measured = targets[users], len(users)
    run = run_cascade(pipeline, cold, phase, progress, requests=requests)  # type: ignore[arg-type]
    ok = {s for s, c in run["status"].items() if c.get("ok", 0) > 0} | {"final"}
    stages = [s for s in (*SCORED, "final") if s in ok]
    slices = item_slices(cold, targets)
    if per_user is not None:
        for name, users in slices.items():
            per_user[name] = {s: per_user_metrics(run["tops"][s][users], targets[users])["ndcg@10"] for s in stages}
            per_user[name].update({f"candidates:{s}": candidates_found([c[u] for u in users], targets[users])
                                   for s, c in run["candidates"].items() if s in SCORED and s in ok})
    return {
        "item_side_knowledge": item_side_knowledge(settings),
        "slices": {name: {**slice_table({s: run["tops"][s][users] for s in stages}, targets[users], stages,
                                        seed=settings.seed, n_boot=n_boot),
                          "candidate_recall": stage_candidate_recall(settings, run, targets, users)}
                   for name, users in slices.items()},
        "new_items_among_candidates": {s: round(float(np.mean([np.isin(c, cold.unseen_items).sum()
                                                                for c in run["candidates"][s]])), 3)
                                       for s in SCORED if s in ok},
        "stage_status": run["status"],
        **({"measured_users": measured, "of_users": int(cold.n_users)} if measured is not None else {}),
    }
