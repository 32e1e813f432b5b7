"""Train the two-tower recall model and write its artifacts.

Training is SASRec-style next-item prediction at every position (Kang & McAuley 2018): each
user's sequence is cut from the end into windows of ``max_len``; the user tower's output at
position t is scored against the target item t+1. The loss is a softmax over the whole
catalog when it is small (cheap and the strongest choice at ML scale), else a sampled
softmax over shared negatives drawn from the item frequency with logQ correction (Yi et
al. 2019, "Sampling-bias-corrected neural modeling for large corpus item recommendations").
AdamW, dropout, early stopping on full-ranking NDCG@10 of held-out targets with patience (8
evaluations: ML-100K's valid curve plateaus for 4-5 of them before climbing again; see ``RecallConfig``),
and a budget of softmax logits (``max_train_logits``, the dominant cost of a step) that bounds
a fit at scale; the best evaluated weights are kept. Bit-for-bit deterministic for a given seed
and thread count, on a busy machine as on a quiet one, unless the wall-clock safety cap
(``max_train_s``) stops a fit first (the report's ``out_of_time``; ``jobs.train.training_warnings``
then says so).

Reproducibility: the fit runs under ``torch.use_deterministic_algorithms``. Without it, two fits
of the same seed on 2 threads gave the same epochs and metrics but item vectors up to 4.6e-7
apart, and the coarse ranker downstream amplified that (its early stop moved from iteration 21
to 10, coarse NDCG@10 0.1329 vs 0.1194 on the same seed of ML-100K as MovieLens CSV). The
source is the backward of advanced indexing (``vectors[ids]``, ``h[mask]``), an
``index_put_(accumulate=True)`` whose CPU kernel adds in thread order; the deterministic kernel
sorts the indices first. Measured on ML-100K-sized data, 6 epochs, 2 threads, two runs each:
default 35.2 / 36.6 s with differing vectors, deterministic 27.2 / 28.8 s identical
(1 thread: identical, 38.9 / 40.0 s).

Items no training sequence holds (new items, e.g. the cold-item protocol's) are unknown, not
negatives: they are masked out of the full softmax and never sampled as negatives, and their
vectors are their content alone (``ItemTower``'s ``known`` mask); ``id_dropout`` teaches the
content part to stand alone (see ``recall.towers``).

The items a user had before a target are no negatives for it either (``mask_history``, on by
default): the served ranking excludes a user's history, so the loss does not spend its gradient
pushing those down; a repeat of an earlier item stays a target. ``recall.windows.seen_pairs`` lists them as
(target row, item) pairs, at most ``len(prior) + max_len`` per row, never a ``[rows, catalog]``
mask. On ML-100K, 3 seeds paired: two-tower NDCG@10 0.1059 -> 0.1196 (+0.0137 +- 0.0030) and
candidate recall@200 0.8303 -> 0.8360 (+0.0057 +- 0.0016); coarse NDCG@10 +0.0029 +- 0.0035 and
coarse@50 -0.0138 +- 0.0080 (``reports/h18_seeds_ml100k_mask_history.json``).

Refit (``RecallConfig.refit``, off by default): once early stopping on the valid items has chosen
the epoch count, the served model is trained again from scratch, same seed, on each user's
training sequence *plus its valid item* for that many epochs, and the extra channels are refitted
on those sequences (their shares stay the ones gated with the early-stopped model). The valid item
is the last item of every test-time history and each user's most recent interaction; before, no
model learnt from it (it was the early-stopping target). The early-stopped model stays in
``recall/early_stopped/``: the jobs that tune or measure on valid items load it
(``RecallStage.load(phase="valid")``, ``cascade.registry.build_pipeline(phase=...)``), since the
served one has learnt those items. The held-out copy (``recall_holdout``, given ``sequences``) is
never refit: it would learn the coarse ranker's labels. On ML-100K, seeds 42-44
(``reports/h18_refit_probe_session24_ml100k.json``, the served merge): candidate recall@200
0.8360 -> 0.8409 (+0.0064, +0.0074, +0.0011), co-visitation's own 0.7731 -> 0.7752, EASE's
0.7487 -> 0.7572, two-tower NDCG@10 0.1196 -> 0.1219; the refit takes 130-240 s on top of a
195-260 s fit. In the whole cascade (``reports/h18_refit_vs_early_stopped_ml100k.json``, the refit
paired per seed against the early-stopped model under the same coarse ranker) coarse@50 rises
+0.0074 +- 0.0021 but what is served does not: coarse = final NDCG@10 -0.0051, -0.0023, +0.0023
(mean -0.0017 +- 0.0037, within the spread). No lift where it counts, for one more fit: off by default.

Artifacts in ``out_dir`` (the per-dataset ``recall/`` directory): ``model.pt`` (both towers'
state dicts), ``model.json`` (config + vocabularies), ``item_vectors.npy``, ``index/`` (faiss,
via ``recall.index.ItemIndex``), ``report.json``, and ``text_cache/``; with the refit
also ``early_stopped/`` (the same files but ``text_cache/``, for the early-stopped model).

Measured on ML-100K (5-core, leave-one-out, full ranking, history excluded; default config,
seed 42, 2 CPU threads, inside ``recsys eval``): 60 epochs (patience; best 44) in 244 s;
valid NDCG@10 0.132; test NDCG@10 0.116, Recall@10 0.216, Recall@200 0.836 (popularity: NDCG@10
0.045, Recall@200 0.480). Without ``mask_history`` 77 epochs (the logit budget; best 72), test
NDCG@10 0.105, Recall@10 0.207, Recall@200 0.835. With patience 3 and no masking the same seed stopped at epoch 28 (best 22): test
NDCG@10 0.098, Recall@200 0.792 (``reports/h18_seeds_ml100k_patience8_deterministic.json``).

Threads (issue 18): training used one of two cores because ``train_threads`` defaulted to 1,
and it did so because 2 threads ran several times slower: libgomp's idle workers spin-wait
after every parallel region (torch's and faiss's own libgomp copies each), which on a shared
box stalls every barrier. Per step the time is in the full-softmax matmul and log-softmax over
the catalog (~55%) and dropout's bernoulli (~9%), big enough ops for two threads to help once
the workers sleep instead of spin (``recall/__init__`` sets ``OMP_WAIT_POLICY=PASSIVE``).
Measured on ML-100K in one run (seed 42, box otherwise idle but for tests): 1 thread 155 s,
2 threads 117 s, identical epochs and metrics. (The holdout fit hit the old 240 s wall-clock
cap in every seed of the issue-18 runs at 1 thread: why a logit budget now bounds a fit.)

Deliberately left out: hyper-parameter search, hard-negative mining, multi-process loading.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from offline.protocol import SALT_EARLY_STOP, SALT_TEST_REPORT, user_sample
from offline.split import Split
from recall.config import DEFAULT_DEPTH, EARLY_STOPPED_DIR, RecallConfig
from recall.extra_channels import refit_channels, train_channels
from recall.features import ItemFeatures, UserVocab
from recall.index import ItemIndex
from recall.scoring import full_ranking_metrics, user_vectors
from recall.text import embed_items
from recall.towers import ItemTower, UserTower
from recall.windows import seen_pairs, training_windows
from recsys.atomic import atomic_write, atomic_write_json

MODEL_FILE, SPEC_FILE, VECTORS_FILE, INDEX_DIR, REPORT_FILE, TEXT_CACHE_DIR = (
    "model.pt", "model.json", "item_vectors.npy", "index", "report.json", "text_cache")


def _batch_loss(
    item_tower: ItemTower, user_tower: UserTower, x: torch.Tensor, y: torch.Tensor, attrs: torch.Tensor,
    config: RecallConfig, log_q: torch.Tensor | None, gen: torch.Generator, prior: list[np.ndarray],
) -> torch.Tensor:
    mask = y >= 0
    if log_q is None:  # full softmax over the catalog; items never trained on are unknown, not negatives
        items = item_tower.all_items()
        h = user_tower(items, x, attrs)[mask] / config.temperature  # scale [b, d], not [b, n_items]
        logits = (h @ items.T).masked_fill(~item_tower.known[None, :], float("-inf"))
        if config.mask_history:  # the served ranking never shows them: not negatives either
            # in place is safe: masked_fill's backward keeps only its mask
            logits.index_put_(seen_pairs(x, y, prior), torch.tensor(float("-inf")))
        return F.cross_entropy(logits, y[mask])
    # log_q is -inf for items never trained on: never sampled as negatives
    negatives = torch.multinomial(log_q.exp(), config.n_negatives, replacement=True, generator=gen)
    needed, local = torch.unique(torch.cat([x[x >= 0], y[mask], negatives]), return_inverse=True)
    vecs = item_tower(needed)
    n_x = int((x >= 0).sum())
    x_local = x.clone()
    x_local[x >= 0] = local[:n_x]
    y_local = local[n_x:n_x + int(mask.sum())]
    neg_local = local[n_x + int(mask.sum()):]
    h = user_tower(vecs, x_local, attrs)[mask]
    # logQ correction: subtract log sampling probability so popular items are not over-penalised.
    pos = (h * vecs[y_local]).sum(-1) / config.temperature - log_q[needed[y_local]]
    neg = h @ vecs[neg_local].T / config.temperature - log_q[needed[neg_local]]
    hit = neg_local[None, :] == y_local[:, None]  # accidental hits
    if config.mask_history:  # sampled negatives the user had before the target are no negatives
        ids = needed.numpy()
        local_prior = [np.searchsorted(ids, p[np.isin(p, ids)]) for p in prior]
        y_grid = torch.full_like(y, -1)
        y_grid[mask] = y_local
        seen = torch.zeros(len(y_local), len(needed), dtype=torch.bool)
        seen[seen_pairs(x_local, y_grid, local_prior)] = True
        hit = hit | seen[:, neg_local]
    neg = neg.masked_fill(hit, float("-inf"))
    logits = torch.cat([pos[:, None], neg], dim=1)
    return F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long))


@dataclass
class _Run:
    """One training run's model and data, built by ``_setup``."""

    item_tower: ItemTower
    user_tower: UserTower
    vocab: UserVocab
    attrs: np.ndarray  # [n_users, 3] UserVocab codes
    seqs: list[np.ndarray]
    targets: np.ndarray
    log_q: torch.Tensor | None  # log item frequency for the sampled loss; None = full softmax

    def item_vectors(self) -> np.ndarray:
        self.item_tower.eval()
        with torch.no_grad():
            return self.item_tower.all_items().numpy()

    def evaluate(self, histories: list[np.ndarray], targets: np.ndarray) -> dict[str, float]:
        """Full-ranking metrics of the users with a target (>= 0); only they are encoded."""
        items = self.item_vectors()
        keep = np.flatnonzero(np.asarray(targets) >= 0)
        read = [histories[u] for u in keep]
        return full_ranking_metrics(user_vectors(self.user_tower, items, read, self.attrs[keep]), items,
                                    read, np.asarray(targets)[keep])


def _only(targets: np.ndarray, users: np.ndarray) -> np.ndarray:
    """``targets`` of ``users``, -1 (not read) for everyone else."""
    out = np.full(len(targets), -1, dtype=np.int64)
    out[users] = targets[users]
    return out


def _setup(
    split: Split, text_cache: Path, config: RecallConfig, sequences: list[np.ndarray] | None,
    targets: np.ndarray | None, progress: bool, seed: int,
) -> _Run:
    seqs = list(split.train_sequences if sequences is None else sequences)
    targets = np.asarray(split.valid if targets is None else targets, dtype=np.int64)
    if len(seqs) != split.n_users or len(targets) != split.n_users:
        raise ValueError(f"need one sequence and one target per user ({split.n_users}); "
                         f"got {len(seqs)} sequences and {len(targets)} targets")
    # early stopping and the channel-share search read at most tune_users of them (-1: not read)
    sampled = user_sample(np.flatnonzero(targets >= 0), config.tune_users, seed, salt=SALT_EARLY_STOP)
    targets = _only(targets, sampled)
    text = None
    if config.use_text:
        text = embed_items(split.items, text_cache, progress=progress)
    vocab = UserVocab.from_users(split.users)
    counts = np.bincount(np.concatenate([np.zeros(0, np.int64), *seqs]), minlength=split.n_items)
    known = counts > 0  # an item no training sequence holds (a new item) is placed by its content alone
    log_q = None
    if not config.uses_full_softmax(split.n_items):
        smoothed = np.where(known, counts + 1.0, 0.0)
        with np.errstate(divide="ignore"):
            log_q = torch.from_numpy(np.log(smoothed / smoothed.sum())).float()
    return _Run(
        item_tower=ItemTower(ItemFeatures.from_items(split.items, text), config.dim, known=known,
                             id_dropout=config.id_dropout),
        user_tower=UserTower(config.dim, config.max_len, config.n_blocks, config.n_heads, config.dropout,
                             vocab.sizes),
        vocab=vocab, attrs=vocab.encode_table(split.users), seqs=seqs, targets=targets, log_q=log_q,
    )


def _fit(run: _Run, config: RecallConfig, seed: int, t0: float, progress: bool, epochs: int | None = None,
         max_logits: float | None = None) -> dict[str, Any]:
    """The epoch loop with early stopping; leaves the best evaluated weights in the towers.

    With ``epochs`` (the refit) it trains that many, evaluates nothing and keeps the last weights;
    ``max_logits`` then replaces ``config.max_train_logits`` as the budget (the refit's share of what the
    early-stopped fit had spent at its best evaluation). The wall-clock cap holds either way."""
    params = list(run.item_tower.parameters()) + list(run.user_tower.parameters())
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    x_all, y_all, owner, start = training_windows(run.seqs, config.max_len)
    gen, rng = torch.Generator().manual_seed(seed), np.random.default_rng(seed)
    best: dict[str, Any] = {"valid": {"ndcg@10": -1.0}, "best_epoch": 0, "state": None}
    history: list[dict[str, Any]] = []
    bad_evals, epoch, out_of_time, out_of_budget, steps, logits, cut_short = 0, 0, False, False, 0, 0, False
    scored = len(run.item_tower.known) if run.log_q is None else 1 + config.n_negatives  # items per target position
    positions = (y_all >= 0).sum(axis=1)  # target positions per window
    budget = max_logits if epochs else config.max_train_logits
    budget = float("inf") if budget is None else budget
    last = epochs or config.max_epochs
    bar = tqdm(range(1, last + 1), desc="two-tower refit" if epochs else "two-tower", disable=not progress)
    for epoch in bar:
        run.item_tower.train()
        run.user_tower.train()
        losses = []
        order = rng.permutation(len(x_all))
        for s in range(0, len(order), config.batch_size):
            rows = order[s:s + config.batch_size]
            loss = _batch_loss(run.item_tower, run.user_tower, torch.from_numpy(x_all[rows]),
                               torch.from_numpy(y_all[rows]), torch.from_numpy(run.attrs[owner[rows]]),
                               config, run.log_q, gen,
                               [run.seqs[owner[r]][:start[r]] for r in rows] if config.mask_history else [])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            steps += 1
            logits += int(positions[rows].sum()) * scored
            out_of_budget = logits >= budget
            out_of_time = time.perf_counter() - t0 > config.max_train_s
            if out_of_budget or out_of_time:
                cut_short = s + config.batch_size < len(order) or epoch < last
                break  # within the epoch: one epoch over millions of windows can outlast the budget many times
        if epochs:  # the refit: no held-out target to evaluate on
            bar.set_postfix(loss=round(float(np.mean(losses)), 4))
            if out_of_budget or out_of_time:
                break
            continue
        if epoch % config.eval_every and epoch != config.max_epochs and not (out_of_budget or out_of_time):
            continue
        metrics = run.evaluate(run.seqs, run.targets)
        history.append({"epoch": epoch, "loss": round(float(np.mean(losses)), 4), **metrics,
                        "s": round(time.perf_counter() - t0, 1)})
        bar.set_postfix(loss=history[-1]["loss"], ndcg10=metrics["ndcg@10"])
        if metrics["ndcg@10"] > best["valid"]["ndcg@10"]:
            state = copy.deepcopy((run.item_tower.state_dict(), run.user_tower.state_dict()))
            best, bad_evals = {"valid": metrics, "best_epoch": epoch, "state": state, "logits": logits}, 0
        else:
            bad_evals += 1
        if bad_evals >= config.patience or out_of_budget or out_of_time:
            break
    bar.close()
    if epochs:
        # the budget reached at the last step of the last epoch is the refit done, not cut
        return {"epochs": epoch, "n_windows": len(x_all), "steps": steps, "logits": logits,
                "out_of_budget": out_of_budget and cut_short, "out_of_time": out_of_time and cut_short and not out_of_budget}
    run.item_tower.load_state_dict(best["state"][0])
    run.user_tower.load_state_dict(best["state"][1])
    return {"epochs": epoch, "best_epoch": best["best_epoch"], "n_windows": len(x_all), "steps": steps,
            "logits": logits, "best_logits": best["logits"], "positions": int(positions.sum()),
            "out_of_budget": out_of_budget, "out_of_time": out_of_time and not out_of_budget,
            "loss": "full" if run.log_q is None else "sampled", "valid": best["valid"], "history": history}


@contextmanager
def deterministic_kernels() -> Iterator[None]:
    """Torch's deterministic kernels inside the block, the caller's setting restored after (see
    module doc: Reproducibility). ``warn_only``: an op without one warns rather than stopping a fit."""
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=before[1] if before[0] else True)  # a caller's strict stays
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def train_two_tower(
    split: Split, out_dir: Path, config: RecallConfig, *, sequences: list[np.ndarray] | None = None,
    early_stop_targets: np.ndarray | None = None, progress: bool = True, seed: int = 42, depth: int = DEFAULT_DEPTH,
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
    run = _setup(split, out_dir / TEXT_CACHE_DIR, config, sequences, early_stop_targets, progress, seed)
    with deterministic_kernels():
        report = _fit(run, config, seed, t0, progress)
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
        report["refit"] = _refit(split, out_dir, config, report, progress, seed)
        report["test"] = report["refit"].pop("test")
        report["train_s"] = round(time.perf_counter() - t0, 1)
        (out_dir / REPORT_FILE).write_text(json.dumps(report, indent=2))
    return report


def _test_targets(split: Split, config: RecallConfig, seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Test histories and targets on a sample of the early-stopping size (-1: not read)."""
    read = user_sample(np.arange(split.n_users), config.tune_users, seed, salt=SALT_TEST_REPORT)
    test = _only(np.asarray(split.test, dtype=np.int64), read)
    return [split.history(u, "test") if test[u] >= 0 else np.zeros(0, np.int64) for u in range(split.n_users)], test


def _refit(split: Split, out_dir: Path, config: RecallConfig, fitted: dict[str, Any], progress: bool, seed: int
           ) -> dict[str, Any]:
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
    run = _setup(split, out_dir / TEXT_CACHE_DIR, config, sequences, np.full(split.n_users, -1), progress, seed)
    positions = sum(len(s) for s in sequences)  # target positions: every item (the first after BOS)
    # the same logits per target position as the early-stopped fit had spent at its best evaluation: a fit
    # the budget cut inside an epoch (large data) is not refit for whole epochs
    budget = fitted["best_logits"] * positions / max(fitted["positions"], 1)
    with deterministic_kernels():
        report = _fit(run, config, seed, t0, progress, epochs=max(int(fitted["best_epoch"]), 1), max_logits=budget)
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
