"""Train the cascade's stages in order on a prepared split (``jobs.prepare``), reusing current ones.

Artifacts of one dataset live under one directory (see ``recsys.contract``):
``split/`` (the leave-one-out split), ``recall/``, ``recall_holdout/`` (a second recall
model for coarse-ranker training data), ``coarse/``, ``llm/``, ``fusion/<stages>/``.

Why a second recall model: the coarse ranker learns from recall candidates for "training
sequence before item j -> item j" for each user's last ``coarse.train_positions`` items.
Candidates from a recall model that trained on those items would carry inflated recall
scores for the labels, and LightGBM would learn to over-trust them. ``recall_holdout`` is
trained without them, so the coarse ranker's training features look like serving-time ones.

Deliberately left out: evaluation (``jobs.evaluation.evaluate``), LLM adaptation (``llm_rerank.adapt``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from cascade.registry import (
    build_pipeline,
    config_id,
    recall_config,
    recall_depth,
    serving_config_id,
    weights_key,
)
from cascade.settings import Settings
from jobs.fusion_gate import tune_fusion
from llm_rerank.adapt import train_llm
from offline.split import Split, split_id
from recall.stage import RecallStage
from recsys.atomic import atomic_write_json, json_default
from recsys.child_guard import die_with_parent
from recsys.manifest import MANIFEST_FILE, write_manifest
from recsys.pipeline import PipelineStage
from recsys.progress import interactive

log = logging.getLogger(__name__)

STAGE_ORDER = ("recall", "recall_holdout", "coarse", "llm", "fusion")
DEFAULT_STAGES = ("recall", "recall_holdout", "coarse", "fusion")
# Below this many training events the two two-towers fit one after the other: such a fit takes
# seconds, less than starting two child processes that each import torch (~3-5 s on 2 cores).
AT_ONCE_MIN_EVENTS = 20_000


def holdout_sequences(split: Split, positions: int = 1) -> tuple[list[np.ndarray], np.ndarray]:
    """Train sequences without their last ``positions`` items, and early-stopping targets.

    The target of user u is the first held-out item (what follows the shortened sequence),
    -1 for users too short to hold anything out (their sequence stays whole so the model
    still learns from it, and they are left out of early stopping).
    """
    seqs, targets = [], np.full(split.n_users, -1, dtype=np.int64)
    for u, seq in enumerate(split.train_sequences):
        cut = min(positions, len(seq) - 1)
        if cut >= 1:
            seqs.append(seq[:-cut])
            targets[u] = seq[-cut]
        else:
            seqs.append(seq)
    return seqs, targets


def train_stages(
    settings: Settings, artifact_dir: Path, split: Split, *, stages: tuple[str, ...] = DEFAULT_STAGES,
    force: bool = False, progress: bool = True,
) -> dict[str, Any]:
    """Train ``stages`` in cascade order; a stage whose artifacts exist is reused unless ``force``."""
    unknown = set(stages) - set(STAGE_ORDER)
    if unknown:
        raise ValueError(f"unknown stage(s) to train: {sorted(unknown)}; choose from {STAGE_ORDER}")
    artifact_dir = Path(artifact_dir)
    current = split_id(artifact_dir)
    report: dict[str, Any] = {}
    fitted: dict[str, dict[str, Any]] = {}
    for stage in (s for s in STAGE_ORDER if s in stages):
        stage_dir = _stage_dir(settings, artifact_dir, stage)
        meta = _read_meta(stage_dir)
        cid = config_id(settings, stage)
        upstream = _upstream(settings, artifact_dir, stage)
        if (not force and meta is not None and meta.get("split_id") == current
                and meta.get("config_id") == cid
                and meta.get("upstream", upstream) == upstream):  # an older stage.json has no upstream record
            _record_reused(stage_dir, meta, serving_config_id(settings, stage))
            report[stage] = {"reused": True, **meta.get("report", {})}
            continue
        # an interrupted retrain must not leave the old completion marker (or digests) vouching for half-new files
        (stage_dir / "stage.json").unlink(missing_ok=True)
        (stage_dir / MANIFEST_FILE).unlink(missing_ok=True)
        if stage in fitted:  # fitted beside recall (fit_two_towers)
            rep = fitted.pop(stage)
        elif (stage == "recall" and "recall_holdout" in stages and fit_threads(settings) is not None
              and len(split.train) >= AT_ONCE_MIN_EVENTS):
            # recall_holdout is retrained after a retrained recall anyway (force, below): both at once
            (artifact_dir / "recall_holdout" / "stage.json").unlink(missing_ok=True)
            (artifact_dir / "recall_holdout" / MANIFEST_FILE).unlink(missing_ok=True)
            rep, fitted["recall_holdout"] = fit_two_towers(settings, artifact_dir, split, progress)
        else:
            rep = _timed(stage, settings, artifact_dir, split, progress)
        report[stage] = rep
        _write_meta(stage_dir, rep, current, cid, upstream, serving_config_id(settings, stage))
        force = True  # a retrained stage invalidates every stage trained on its output
    return report


def fit_threads(settings: Settings) -> int | None:
    """Torch threads of each two-tower fit when ``recall`` and ``recall_holdout`` are fitted at once,
    or None when they are fitted one after the other.

    At once when ``recall.train_threads`` is 0 (every core) and the process may run on at least 2
    cores, each fit on half of them: two fits on one thread each finished ~1.5x sooner than one
    after the other on two threads each (one ML-100K fit: 155 s on 1 thread, 117 s on 2). The
    count depends on the cores, never on the load, so a seed gives the same models on a busy
    machine as on a quiet one; a set ``train_threads`` fits them one after the other on that many, as
    does a Ray cluster with more than one worker (``settings.ray``: each fit is spread over it) and a
    daemonic process (which may not start children).
    """
    cores = len(os.sched_getaffinity(0))
    alone = (settings.recall.train_threads == 0 and not settings.ray.distributed
             and not multiprocessing.current_process().daemon)
    return cores // 2 if alone and cores >= 2 else None


def fit_two_towers(settings: Settings, artifact_dir: Path, split: Split, progress: bool,
                   threads: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fit ``recall`` and ``recall_holdout`` at the same time, each in a child process on ``threads``
    torch threads (default ``fit_threads``); their reports, as ``train_stages`` records them.

    The same models as fitted one after the other on that many threads (``recall.fit`` is
    deterministic for a seed and thread count), in a ``guarded_pool``. On a terminal only recall draws
    its bar (two bars would overwrite each other)."""
    threads = threads or fit_threads(settings) or 1
    one_each = settings.model_copy(update={"recall": settings.recall.model_copy(update={"train_threads": threads})})
    if recall_config(settings).use_text:  # computed once here, not by both children into the shared cache
        from recall.text import embed_items, text_cache_dir  # lazy: imports torch

        embed_items(split.items, text_cache_dir(), progress=progress)
    with guarded_pool(2) as pool:
        recall = pool.submit(_timed, "recall", one_each, artifact_dir, split, progress)
        holdout = pool.submit(_timed, "recall_holdout", one_each, artifact_dir, split, progress and not interactive())
        return recall.result(), holdout.result()


def guarded_pool(workers: int) -> ProcessPoolExecutor:
    """A pool of ``workers`` spawned processes that die with this one (``recsys.child_guard.die_with_parent``):
    an eval stopped with SIGTERM or SIGKILL mid-fit leaves no fit running on its cores. Children are
    spawned, not forked: a fork of a process whose OpenMP runtime has started can hang in its first
    parallel region."""
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=die_with_parent, initargs=(os.getpid(),))


def _timed(stage: str, settings: Settings, artifact_dir: Path, split: Split, progress: bool) -> dict[str, Any]:
    """Train one stage; its report with the ``seconds`` it took."""
    t0 = time.perf_counter()
    rep = _TRAINERS[stage](settings, artifact_dir, split, progress)
    rep["seconds"] = round(time.perf_counter() - t0, 2)
    return rep


def _stage_dir(settings: Settings, artifact_dir: Path, stage: str) -> Path:
    """Where a stage's artifacts (and its completion marker) live; fusion has one per stage set."""
    if stage == "fusion":
        return artifact_dir / "fusion" / weights_key(settings)
    return artifact_dir / stage


def _read_meta(directory: Path) -> dict[str, Any] | None:
    path = directory / "stage.json"
    return json.loads(path.read_text()) if path.exists() else None


# the stages whose trained output a stage learns from: retraining one of them (in any command, e.g. the
# LLM probe retraining a stale coarse) makes the stages below it stale too
DEPENDS_ON = {"recall": (), "recall_holdout": (), "coarse": ("recall", "recall_holdout"),
              "llm": ("recall", "coarse"), "fusion": ("recall", "coarse", "llm")}


def _upstream(settings: Settings, artifact_dir: Path, stage: str) -> dict[str, str | None]:
    """The ``run_id`` of each trained stage ``stage`` depends on (``DEPENDS_ON``), as now on disk; for
    ``coarse`` unless its LLM columns are off, also the LLM item embeddings it would read
    (``llm_embeddings_id``), so embeddings written or rewritten by ``recsys tag --method embed`` retrain it."""
    out: dict[str, str | None] = {}
    for dep in DEPENDS_ON[stage]:
        meta = _read_meta(_stage_dir(settings, artifact_dir, dep))
        if meta is not None:
            out[dep] = meta.get("run_id")
    if stage == "coarse" and settings.coarse.llm_embedding_features is not False:
        embeddings = llm_embeddings_id(artifact_dir / "tags")
        if embeddings is not None:  # absent: the record stays that of a catalog never embedded
            out["llm_embeddings"] = embeddings
    return out


def llm_embeddings_id(tags: Path) -> str | None:
    """A fingerprint of the LLM item embeddings in ``tags`` (``hidden.npy``'s size and modification
    time with ``version.json``'s bytes, which name the model, text and catalog), None without them.

    >>> llm_embeddings_id(Path("/nonexistent")) is None
    True
    """
    hidden, version = tags / "hidden.npy", tags / "version.json"
    if not (hidden.is_file() and version.is_file()):
        return None
    stat = hidden.stat()
    return hashlib.sha256(f"{stat.st_size}:{stat.st_mtime_ns}:".encode() + version.read_bytes()).hexdigest()[:16]


def _write_meta(directory: Path, report: dict[str, Any], split_id: str, config_id: str = "",
                upstream: dict[str, str | None] | None = None, serving_id: str = "") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    write_manifest(directory)  # the digests every load checks (recsys.manifest), before the marker
    atomic_write_json(directory / "stage.json", {"split_id": split_id, "config_id": config_id,
                                                 "serving_config_id": serving_id,
                                                 "run_id": uuid.uuid4().hex, "upstream": upstream or {},
                                                 "report": report},
                      default=json_default)  # last write: marks the stage complete


def _record_reused(directory: Path, meta: dict[str, Any], serving_id: str) -> None:
    """What a reused stage trained before it was recorded lacks: its manifest (the files are vouched for
    as they are now, by this run) and its ``serving_config_id`` (``cascade.registry``)."""
    if not (directory / MANIFEST_FILE).exists():
        write_manifest(directory)
    if meta.get("serving_config_id") != serving_id:
        atomic_write_json(directory / "stage.json", {**meta, "serving_config_id": serving_id}, default=json_default)


def _train_recall(settings: Settings, artifact_dir: Path, split: Split, progress: bool) -> dict[str, Any]:
    from recall.train import train_two_tower  # lazy: imports torch

    return train_two_tower(split, artifact_dir / "recall", recall_config(settings), progress=progress,
                           seed=settings.seed, depth=recall_depth(settings), cluster=settings.ray)


def _train_recall_holdout(settings: Settings, artifact_dir: Path, split: Split, progress: bool) -> dict[str, Any]:
    from recall.train import train_two_tower  # lazy: imports torch

    seqs, targets = holdout_sequences(split, settings.coarse.train_positions)
    return train_two_tower(
        split, artifact_dir / "recall_holdout", recall_config(settings),
        sequences=seqs, early_stop_targets=targets, progress=progress, seed=settings.seed,
        depth=recall_depth(settings), cluster=settings.ray,
    )


def holdout_recall(settings: Settings, artifact_dir: Path, split: Split, positions: int
                   ) -> tuple[RecallStage, RecallStage]:
    """``recall_holdout`` as the coarse ranker's training reads it: (for the valid groups, the valid
    phase's popularity counts; for the train groups, every training event but the train labels,
    ``coarse_rank.dataset.prefix_popularity``, which is what ``recall_holdout`` learnt from).
    Test-time counts would hold each label's own event (and every valid one), which no served
    request's popularity holds. The stage serves the recall stage's config (``recall_config``: a
    ``recall_llm`` stage's own params left out; the LLM channel has no held-out copy)."""
    from coarse_rank.dataset import prefix_popularity  # lazy: imports pandas

    spec = settings.pipeline.stage("recall")
    recall = RecallStage(spec.model_copy(update={"kind": "recall", "params": {}}), recall_config(settings))
    recall.load(artifact_dir, subdir="recall_holdout", phase="valid")
    return recall, recall.with_popularity(prefix_popularity(split, positions))


def _train_coarse(settings: Settings, artifact_dir: Path, split: Split, progress: bool) -> dict[str, Any]:
    from coarse_rank.train import train_coarse  # lazy: imports scipy

    setting, tags = settings.coarse.llm_embedding_features, artifact_dir / "tags"
    llm, missing = None, None
    # true: always (a missing file is an error); auto: whenever `recsys tag --method embed` has written them
    if setting is True or (setting == "auto" and (tags / "hidden.npy").is_file() and (tags / "version.json").is_file()):
        from jobs.tagging.embed import EmbedSettings, coarse_item_embeddings  # lazy: imports torch

        sequences = holdout_sequences(split, settings.coarse.train_positions)[0]  # projected without the coarse labels
        llm = coarse_item_embeddings(split, tags, sequences, EmbedSettings(seed=settings.seed))
    elif setting == "auto":
        missing = f"no LLM item embeddings in {tags}; `recsys tag --method embed` writes them"
    recall, before_labels = holdout_recall(settings, artifact_dir, split, settings.coarse.train_positions)
    # on a cluster each worker builds the two stages again (a TorchScript tower does not travel)
    recipe = partial(holdout_recall, settings, artifact_dir, split, settings.coarse.train_positions)
    return train_coarse(split, recall, artifact_dir / "coarse", settings.coarse, seed=settings.seed, progress=progress,
                        train_stage=before_labels, llm=llm, cluster=settings.ray, worker_stages=recipe,
                        llm_missing=missing)


def _train_fusion(settings: Settings, artifact_dir: Path, split: Split, progress: bool) -> dict[str, Any]:
    return tune_fusion(settings, artifact_dir, split, progress=progress)


def _train_llm(settings: Settings, artifact_dir: Path, split: Split, progress: bool) -> dict[str, Any]:
    # valid phase: the LLM learns from valid items, which the served (refit) recall model has learnt
    cascade = PipelineStage(build_pipeline(settings, artifact_dir, only=("recall", "coarse"), phase="valid"))
    return train_llm(split, cascade, settings.llm, artifact_dir, artifacts_root=Path(settings.artifacts_dir),
                     seed=settings.seed, progress=progress)


_TRAINERS = {"recall": _train_recall, "recall_holdout": _train_recall_holdout, "coarse": _train_coarse,
             "fusion": _train_fusion, "llm": _train_llm}
