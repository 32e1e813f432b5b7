"""Train the two-tower recall model and write its artifacts.

The training loop, its loss and its reproducibility live in ``recall.fit``; this module is the
entry point (``train_two_tower``): fit with early stopping on the valid items, evaluate, fit the
extra channels, optionally refit, save.

Refit (``RecallConfig.refit``, off by default): once early stopping has chosen the epoch count,
the served model is trained again from scratch (same seed, same epochs) on each user's training
sequence plus its valid item, the most recent interaction of every user, which the early-stopped
model never learns from (it is its stopping target); the extra channels are refitted on the same
sequences with the shares gated for the early-stopped model. The early-stopped model stays in
``recall/early_stopped/`` for the jobs that tune or measure on valid items
(``RecallStage.load(phase="valid")``), since the refit has learnt those items. The held-out copy
(``recall_holdout``, given ``sequences``) is never refit: it would learn the coarse ranker's
labels. It stays off by default because on ML-100K (3 seeds) it lifts candidate recall@200 but not
the served NDCG@10, for a second fit.

Threads: training uses every core the process may run on (``train_threads``: 0); the workers
sleep between parallel regions instead of spinning (``recall/__init__`` sets
``OMP_WAIT_POLICY=PASSIVE``), without which two threads ran slower than one on a shared box.

Artifacts in ``out_dir`` (the per-dataset ``recall/`` directory): ``model.pt`` (both towers'
state dicts), ``model.json`` (config + vocabularies), ``item_vectors.npy``, ``index/`` (faiss,
via ``recall.index.ItemIndex``) and ``report.json``; with the refit also ``early_stopped/`` (the
same files, for the early-stopped model). Item text embeddings live in the machine's cache
(``recall.text.text_cache_dir``), shared by every fit.

Deliberately left out: hyper-parameter search, hard-negative mining, multi-process loading.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from offline.protocol import SALT_TEST_REPORT, user_sample
from offline.split import Split
from recall.artifacts import INDEX_DIR, MODEL_FILE, REPORT_FILE, SPEC_FILE, VECTORS_FILE
from recall.config import DEFAULT_DEPTH, EARLY_STOPPED_DIR, RecallConfig
from recall.distributed import fit_distributed
from recall.extra_channels import refit_channels, train_channels
from recall.features import UserVocab
from recall.fit import Run, deterministic_kernels, fit, only_targets, setup_run
from recall.index import ItemIndex
from recall.text import text_cache_dir
from recall.towers import ItemTower, UserTower
from recsys.atomic import atomic_write, atomic_write_json
from recsys.cluster import ClusterConfig


def train_two_tower(
    split: Split, out_dir: Path, config: RecallConfig, *, sequences: list[np.ndarray] | None = None,
    early_stop_targets: np.ndarray | None = None, progress: bool = True, seed: int = 42, depth: int = DEFAULT_DEPTH,
    cluster: ClusterConfig | None = None,
) -> dict[str, Any]:
    """Train, save the artifacts to ``out_dir`` and return the report.

    With extra channels on (``RecallConfig.extra_channels``), they are fitted on the same
    sequences and their shares of ``depth`` tuned on the early-stopping targets
    (``recall.extra_channels.train_channels``; ``split`` need not be saved anywhere).

    Trains on ``sequences`` (default ``split.train_sequences``) and early-stops on
    ``early_stop_targets`` (default ``split.valid``) ranked from those sequences with them
    excluded. The report holds epochs, best valid metrics, seconds and, with the default
    data only, test metrics (input = train + valid item, as in ``offline.split``).

    With the default data and ``config.refit``, that early-stopped model goes to
    ``out_dir/early_stopped`` and ``out_dir`` gets the refit (``_refit``); the report's ``test``
    is then the refit's, ``test_early_stopped`` the other's, and ``refit`` says how it went.
    Given ``sequences`` or targets (``recall_holdout``), there is no refit: it would learn the held-out items.
    """
    t0 = time.perf_counter()
    torch.set_num_threads(config.train_threads or len(os.sched_getaffinity(0)))
    out_dir = Path(out_dir)
    default_data = sequences is None and early_stop_targets is None
    refit = config.refit and default_data
    fit_dir = out_dir / EARLY_STOPPED_DIR if refit else out_dir
    if not refit:
        shutil.rmtree(out_dir / EARLY_STOPPED_DIR, ignore_errors=True)  # a valid-phase load must not find an old one
    torch.manual_seed(seed)
    run = setup_run(split, text_cache_dir(), config, sequences, early_stop_targets, progress, seed)
    report = _fit(run, config, seed, t0, progress, cluster, out_dir.parent)
    report["early_stop_users"] = int((run.targets >= 0).sum())
    test = _test_targets(split, config, seed) if default_data else None
    if test is not None:
        report["test"] = run.evaluate(*test)
    report["train_s"] = round(time.perf_counter() - t0, 1)
    save_artifacts(fit_dir, run.item_tower, run.user_tower, run.item_vectors(), run.vocab, config, report)
    if config.extra_channels:
        t1 = time.perf_counter()
        report["channels"] = train_channels(split, fit_dir.parent, fit_dir.name, run.seqs, run.targets, config, depth,
                                             seed)
        report["channels"]["seconds"] = round(time.perf_counter() - t1, 1)
        (fit_dir / REPORT_FILE).write_text(json.dumps(report, indent=2))
    if refit:
        del run  # the early-stopped towers and data are on disk: not held through a second fit
        report["test_early_stopped"] = report.pop("test")
        report["refit"] = _refit(split, out_dir, config, report, progress, seed, cluster)
        report["test"] = report["refit"].pop("test")
        report["train_s"] = round(time.perf_counter() - t0, 1)
        (out_dir / REPORT_FILE).write_text(json.dumps(report, indent=2))
    return report


def _fit(run: Run, config: RecallConfig, seed: int, t0: float, progress: bool, cluster: ClusterConfig | None,
         storage: Path, epochs: int | None = None, max_logits: float | None = None) -> dict[str, Any]:
    """``recall.fit.fit`` in this process, or data-parallel on the cluster's workers (``recall.distributed``,
    its checkpoint under ``storage``) when ``cluster`` has an address and more than one worker."""
    if cluster is not None and cluster.distributed:
        return fit_distributed(run, config, seed, progress, cluster, storage, epochs=epochs, max_logits=max_logits)
    with deterministic_kernels():
        return fit(run, config, seed, t0, progress, epochs=epochs, max_logits=max_logits)


def _test_targets(split: Split, config: RecallConfig, seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Test histories and targets on a sample of the early-stopping size (-1: not read)."""
    read = user_sample(np.arange(split.n_users), config.tune_users, seed, salt=SALT_TEST_REPORT)
    test = only_targets(np.asarray(split.test, dtype=np.int64), read)
    return [split.history(u, "test") if test[u] >= 0 else np.zeros(0, np.int64) for u in range(split.n_users)], test


def _refit(split: Split, out_dir: Path, config: RecallConfig, fitted: dict[str, Any], progress: bool, seed: int,
           cluster: ClusterConfig | None = None) -> dict[str, Any]:
    """Train the served model again from scratch (same seed) on every user's training sequence plus
    its valid item (``split.history(u, "test")``; not a ``split.unseen_items`` one) for ``fitted["best_epoch"]`` epochs, refit the extra
    channels on those sequences with the shares gated for the early-stopped model, save all to ``out_dir``.

    Why: the valid item is the last thing before the test item in every test-time history, and the
    most recent interaction of each user; the early-stopped model never learnt from it (it is that
    model's early-stopping target). The epoch count stays the early stop's: with about one more
    item per user there is no held-out target left to choose another.
    """
    t0 = time.perf_counter()
    learnt = split.valid_trainable()  # the cold-item protocol's new items are never learnt from
    sequences = [split.history(u, "test") if learnt[u] else split.train_sequences[u] for u in range(split.n_users)]
    torch.manual_seed(seed)
    run = setup_run(split, text_cache_dir(), config, sequences, np.full(split.n_users, -1), progress, seed)
    positions = sum(len(s) for s in sequences)  # target positions: every item (the first after BOS)
    # the same logits per target position as the early-stopped fit had spent at its best evaluation: a fit
    # the budget cut inside an epoch (large data) is not refit for whole epochs
    budget = fitted["best_logits"] * positions / max(fitted["positions"], 1)
    report = _fit(run, config, seed, t0, progress, cluster, out_dir.parent, epochs=max(int(fitted["best_epoch"]), 1),
                  max_logits=budget)
    report["test"] = run.evaluate(*_test_targets(split, config, seed))
    report["train_s"] = round(time.perf_counter() - t0, 1)
    early = hashlib.sha256((out_dir / EARLY_STOPPED_DIR / MODEL_FILE).read_bytes()).hexdigest()[:12]
    save_artifacts(out_dir, run.item_tower, run.user_tower, run.item_vectors(), run.vocab, config,
                   {**fitted, "refit": report}, refit_of=early)
    if config.extra_channels:
        report["channels"] = refit_channels(out_dir, out_dir / EARLY_STOPPED_DIR, sequences, config)
    return report


def save_artifacts(
    out_dir: Path, item_tower: ItemTower, user_tower: UserTower, item_vectors: np.ndarray,
    vocab: UserVocab, config: RecallConfig, report: dict[str, Any], refit_of: str | None = None,
) -> None:
    """Write the model, spec, item vectors, faiss index and report; ``model.json`` last.

    ``refit_of`` (a refit model): the version of the early-stopped copy it was trained after, which
    ``model.json`` records so a valid-phase load finds that copy or refuses (``RecallStage.load``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(out_dir / MODEL_FILE, lambda fh: torch.save(
        {"item_tower": item_tower.state_dict(), "user_tower": user_tower.state_dict()}, fh))
    atomic_write(out_dir / VECTORS_FILE, lambda fh: np.save(fh, item_vectors.astype(np.float32)))
    ItemIndex.build(item_vectors, kind=config.index).save(out_dir / INDEX_DIR)
    (out_dir / REPORT_FILE).write_text(json.dumps(report, indent=2))
    spec = {"config": config.model_dump(), "n_items": len(item_vectors), "user_vocab": vocab.to_json(),
            **({"refit_of": refit_of} if refit_of else {})}
    atomic_write_json(out_dir / SPEC_FILE, spec)


def main(argv: list[str] | None = None) -> None:
    """``python -m recall.train ARTIFACT_DIR [--seed N] [--set key=value ...]``: train on
    ``ARTIFACT_DIR/split`` into ``ARTIFACT_DIR/recall`` with the default ``RecallConfig``
    (values overridden by ``--set``, parsed as JSON when they parse) and print the report."""

    parser = argparse.ArgumentParser(prog="python -m recall.train", description=main.__doc__)
    parser.add_argument("artifact_dir", type=Path)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set expects KEY=VALUE, got {item!r}")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    split = Split.load(args.artifact_dir / "split")
    report = train_two_tower(split, args.artifact_dir / "recall", RecallConfig(**overrides), seed=args.seed)
    print(json.dumps({k: v for k, v in report.items() if k != "history"}, indent=2))


if __name__ == "__main__":
    main()
