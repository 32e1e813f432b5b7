"""The two-tower's training loop: the loss, one run's model and data, the epoch loop.

Training is SASRec-style next-item prediction at every position (Kang & McAuley 2018): each
user's sequence is cut from the end into windows of ``max_len``; the user tower's output at
position t is scored against the target item t+1. The loss is a softmax over the whole
catalog when it is small (cheap and the strongest choice at ML scale), else a sampled
softmax over shared negatives drawn from the item frequency with logQ correction (Yi et
al. 2019, "Sampling-bias-corrected neural modeling for large corpus item recommendations").
AdamW, dropout, early stopping on full-ranking NDCG@10 of held-out targets with patience (8
evaluations: ML-100K's valid curve plateaus for 4-5 of them before climbing again; see ``RecallConfig``),
the best evaluated weights kept. Early stopping ends a fit: the epoch bound scales with the data
(``RecallConfig.epoch_bound``) and a budget of softmax logits (``max_train_logits``) is opt-in; the
report's ``stopped_by`` names what ended a fit, ``converged`` whether early stopping did, and
``settings`` each training setting's value and why (``training_settings``). Bit-for-bit
deterministic for a given seed and thread count, on a busy machine as on a quiet one, unless an
opt-in wall-clock cap (``max_train_s``, off by default) stops a fit first (``stopped_by:
max_train_s``; ``jobs.evaluation.fit_report.training_warnings`` then says so).

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
pushing those down; a repeat of an earlier item stays a target. The full softmax marks them in a
``[targets, catalog]`` bool mask beside its logits of that shape (``recall.windows.seen_mask``); the
sampled one lists them as (target row, item) pairs (``recall.windows.seen_pairs``), at most
``len(prior) + max_len`` per row, never a mask over the catalog. On ML-100K, 3 seeds paired: two-tower NDCG@10 0.1059 -> 0.1196 (+0.0137 +- 0.0030) and
candidate recall@200 0.8303 -> 0.8360 (+0.0057 +- 0.0016); coarse NDCG@10 +0.0029 +- 0.0035 and
coarse@50 -0.0138 +- 0.0080 (``results/decisions/history_masked_ml100k.json``).

Called by ``recall.train.train_two_tower`` (the fit, then the optional refit with ``fit(epochs=...)``).
Deliberately left out: artifacts, the extra channels and the test report (``recall.train``).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from offline.item_neighbours import item_counts
from offline.protocol import SALT_EARLY_STOP, user_sample
from offline.split import Split
from recall.config import RecallConfig
from recall.features import ItemFeatures, UserVocab
from recall.scoring import full_ranking_metrics, user_vectors
from recall.text import embed_items
from recall.towers import ItemTower, UserTower
from recall.windows import (
    epoch_batches,
    seen_mask,
    seen_pairs,
    training_windows,
    trim_padding,
    window_lengths,
)
from recsys.progress import progress_bar


def batch_loss(
    item_tower: ItemTower, user_tower: UserTower, x: torch.Tensor, y: torch.Tensor, attrs: torch.Tensor,
    config: RecallConfig, log_q: torch.Tensor | None, gen: torch.Generator, prior: list[np.ndarray],
) -> torch.Tensor:
    mask = y >= 0
    if log_q is None:  # full softmax over the catalog; items never trained on are unknown, not negatives
        items = item_tower.all_items()
        # the target positions' rows by index, not by boolean mask: the mask's backward is an accumulating
        # index_put, which the deterministic kernels sort
        rows = mask.flatten().nonzero().squeeze(1)
        h = user_tower(items, x, attrs).flatten(0, 1).index_select(0, rows) / config.temperature  # scale [b, d]
        unknown = ~item_tower.known
        blocked = seen_mask(x, y, prior, len(unknown)) if config.mask_history else None  # not shown when served
        if bool(unknown.any()):
            blocked = unknown[None, :] if blocked is None else blocked | unknown[None, :]
        logits = h @ items.T
        return F.cross_entropy(logits if blocked is None else _NoNegatives.apply(logits, blocked), y[mask])
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
    hit = neg_local[None, :] == y_local[:, None]  # accidental hits
    if config.mask_history:  # sampled negatives the user had before the target are no negatives
        ids = needed.numpy()
        local_prior = [np.searchsorted(ids, p[np.isin(p, ids)]) for p in prior]
        y_grid = torch.full_like(y, -1)
        y_grid[mask] = y_local
        seen = torch.zeros(len(y_local), len(needed), dtype=torch.bool)
        seen[seen_pairs(x_local, y_grid, local_prior)] = True
        hit = hit | seen[:, neg_local]
    return sampled_softmax(h / config.temperature, vecs[y_local], vecs[neg_local], log_q[needed[y_local]],
                           log_q[needed[neg_local]], hit)


class _NoNegatives(torch.autograd.Function):
    """``logits`` with the ``blocked`` entries set to -inf in place, for ``F.cross_entropy`` to read.

    The backward passes the gradient through unchanged: at a blocked entry the softmax's probability
    is exactly 0 and no target is ever blocked (a target is a known item, never in its own past), so
    the gradient arriving there is already 0, and zeroing it again (``masked_fill``'s backward) was
    a copy of the whole ``[targets, n_items]`` matrix for nothing. Only valid ahead of a softmax
    cross-entropy over these logits."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, blocked: torch.Tensor) -> torch.Tensor:
        ctx.mark_dirty(logits)
        return logits.masked_fill_(blocked, float("-inf"))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def sampled_softmax(h: torch.Tensor, positives: torch.Tensor, negatives: torch.Tensor, log_q_pos: torch.Tensor,
                    log_q_neg: torch.Tensor, hit: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of each row's positive against negatives shared by all rows, logQ-corrected.

    ``h`` ``[r, d]`` (temperature applied), ``positives`` ``[r, d]``, ``negatives`` ``[k, d]``; ``log_q_*`` the
    log probabilities the items were sampled with; ``hit`` ``[r, k]`` marks negatives that are no negative
    for a row (the positive itself, an item of its history). The correction (Yi et al. 2019) subtracts
    ``log q`` from every logit, so a popular item, sampled often, is not pushed down in proportion to
    how often it is drawn. With every item a negative once and a uniform q the correction is a constant,
    and the loss is the full softmax's.
    """
    pos = (h * positives).sum(-1) - log_q_pos
    neg = (h @ negatives.T - log_q_neg).masked_fill(hit, float("-inf"))
    logits = torch.cat([pos[:, None], neg], dim=1)
    return F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long))


@dataclass
class Run:
    """One training run's model and data, built by ``setup_run``."""

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

    def batch_inputs(self, w: _Windows, rows: np.ndarray, config: RecallConfig, by_length: bool
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[np.ndarray]]:
        """``batch_loss``'s (x, y, attrs, prior) for the windows ``rows``, padding trimmed when bucketed by length."""
        x, y = trim_padding(w.x[rows], w.y[rows]) if by_length else (w.x[rows], w.y[rows])
        return (torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(self.attrs[w.owner[rows]]),
                [self.seqs[w.owner[r]][:w.start[r]] for r in rows] if config.mask_history else [])

    def rows_loss(self, w: _Windows, rows: np.ndarray, config: RecallConfig, gen: torch.Generator,
                  by_length: bool) -> torch.Tensor:
        """One optimizer step's loss over the windows ``rows`` (``recall.distributed``: a worker's share)."""
        x, y, attrs, prior = self.batch_inputs(w, rows, config, by_length)
        return batch_loss(self.item_tower, self.user_tower, x, y, attrs, config, self.log_q, gen, prior)

    def evaluate(self, histories: list[np.ndarray], targets: np.ndarray) -> dict[str, float]:
        """Full-ranking metrics of the users with a target (>= 0); only they are encoded."""
        items = self.item_vectors()
        keep = np.flatnonzero(np.asarray(targets) >= 0)
        read = [histories[u] for u in keep]
        return full_ranking_metrics(user_vectors(self.user_tower, items, read, self.attrs[keep], by_length=True),
                                    items, read, np.asarray(targets)[keep])


def only_targets(targets: np.ndarray, users: np.ndarray) -> np.ndarray:
    """``targets`` of ``users``, -1 (not read) for everyone else."""
    out = np.full(len(targets), -1, dtype=np.int64)
    out[users] = targets[users]
    return out


def setup_run(
    split: Split, text_cache: Path, config: RecallConfig, sequences: list[np.ndarray] | None,
    targets: np.ndarray | None, progress: bool, seed: int,
) -> Run:
    seqs = list(split.train_sequences if sequences is None else sequences)
    targets = np.asarray(split.valid if targets is None else targets, dtype=np.int64)
    if len(seqs) != split.n_users or len(targets) != split.n_users:
        raise ValueError(f"need one sequence and one target per user ({split.n_users}); "
                         f"got {len(seqs)} sequences and {len(targets)} targets")
    # early stopping and the channel-share search read at most tune_users of them (-1: not read)
    sampled = user_sample(np.flatnonzero(targets >= 0), config.tune_users, seed, salt=SALT_EARLY_STOP)
    targets = only_targets(targets, sampled)
    text = None
    if config.use_text:
        text = embed_items(split.items, text_cache, progress=progress)
    vocab = UserVocab.from_users(split.users)
    counts = item_counts(seqs, split.n_items)
    known = counts > 0  # an item no training sequence holds (a new item) is placed by its content alone
    log_q = None
    if not config.uses_full_softmax(split.n_items):
        smoothed = np.where(known, counts + 1.0, 0.0)
        with np.errstate(divide="ignore"):
            log_q = torch.from_numpy(np.log(smoothed / smoothed.sum())).float()
    return Run(
        item_tower=ItemTower(ItemFeatures.from_items(split.items, text), config.dim, known=known,
                             id_dropout=config.id_dropout),
        user_tower=UserTower(config.dim, config.max_len, config.n_blocks, config.n_heads, config.dropout,
                             vocab.sizes),
        vocab=vocab, attrs=vocab.encode_table(split.users), seqs=seqs, targets=targets, log_q=log_q,
    )


@dataclass
class _Spend:
    """What a fit has spent (steps, logits) and whether a cap (logits, wall clock) has been reached."""

    budget: float  # logits
    max_train_s: float | None
    t0: float
    steps: int = 0
    logits: int = 0
    out_of_budget: bool = False
    out_of_time: bool = False

    @property
    def spent(self) -> bool:
        return self.out_of_budget or self.out_of_time

    def add(self, logits: int) -> None:
        """One step over ``logits`` scored logits; the caps are checked after every step."""
        self.steps += 1
        self.logits += logits
        self.out_of_budget = self.logits >= self.budget
        self.out_of_time = self.max_train_s is not None and time.perf_counter() - self.t0 > self.max_train_s


@dataclass
class _Windows:
    """The fit's training windows (``recall.windows.training_windows``) and what the loop reads of them."""

    x: np.ndarray
    y: np.ndarray
    owner: np.ndarray
    start: np.ndarray
    positions: np.ndarray  # target positions per window
    lengths: np.ndarray

    @classmethod
    def of(cls, seqs: list[np.ndarray], max_len: int) -> _Windows:
        x, y, owner, start = training_windows(seqs, max_len)
        return cls(x, y, owner, start, (y >= 0).sum(axis=1), window_lengths(x))


def _train_epoch(run: Run, config: RecallConfig, opt: torch.optim.Optimizer, w: _Windows, gen: torch.Generator,
                 rng: np.random.Generator, by_length: bool, spend: _Spend, scored: int) -> tuple[list[float], bool]:
    """One epoch of optimizer steps; (the losses, whether a cap stopped it before its last batch)."""
    run.item_tower.train()
    run.user_tower.train()
    losses: list[float] = []
    batches = epoch_batches(w.lengths, config.batch_size, rng, by_length=by_length)
    for b, rows in enumerate(batches):
        loss = run.rows_loss(w, rows, config, gen, by_length)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        spend.add(int(w.positions[rows].sum()) * scored)
        if spend.spent:  # within the epoch: one epoch over millions of windows can outlast the budget many times
            return losses, b + 1 < len(batches)
    return losses, False


def fit(run: Run, config: RecallConfig, seed: int, t0: float, progress: bool, epochs: int | None = None,
        max_logits: float | None = None) -> dict[str, Any]:
    """The epoch loop with early stopping; leaves the best evaluated weights in the towers.

    With ``epochs`` (the refit) it trains that many, evaluates nothing and keeps the last weights;
    ``max_logits`` then replaces ``config.max_train_logits`` as the budget (the refit's share of what the
    early-stopped fit had spent at its best evaluation). The wall-clock cap holds either way."""
    params = list(run.item_tower.parameters()) + list(run.user_tower.parameters())
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    w = _Windows.of(run.seqs, config.max_len)
    gen, rng = torch.Generator().manual_seed(seed), np.random.default_rng(seed)
    best: dict[str, Any] = {"valid": {"ndcg@10": -1.0}, "best_epoch": 0, "state": None}
    history: list[dict[str, Any]] = []
    bad_evals, epoch, cut_short = 0, 0, False
    scored = len(run.item_tower.known) if run.log_q is None else 1 + config.n_negatives  # items per target position
    by_length = config.uses_length_buckets(float(w.lengths.mean()) / config.max_len)[0]
    budget = max_logits if epochs else config.max_train_logits
    spend = _Spend(float("inf") if budget is None else budget, config.max_train_s, t0)
    steps_per_epoch = -(-len(w.x) // config.batch_size)
    last = epochs or config.epoch_bound(steps_per_epoch)[0]
    bar = progress_bar(range(1, last + 1), desc="two-tower refit" if epochs else "two-tower", enabled=progress,
                       unit="epoch")
    for epoch in bar:
        losses, stopped_mid_epoch = _train_epoch(run, config, opt, w, gen, rng, by_length, spend, scored)
        if spend.spent:
            cut_short = stopped_mid_epoch or epoch < last
        if epochs:  # the refit: no held-out target to evaluate on
            bar.set_postfix(loss=round(float(np.mean(losses)), 4))
            if spend.spent:
                break
            continue
        if epoch % config.eval_every and epoch != last and not spend.spent:
            continue
        metrics = run.evaluate(run.seqs, run.targets)
        history.append({"epoch": epoch, "loss": round(float(np.mean(losses)), 4), **metrics,
                        "s": round(time.perf_counter() - t0, 1)})
        if metrics["ndcg@10"] > best["valid"]["ndcg@10"]:
            state = copy.deepcopy((run.item_tower.state_dict(), run.user_tower.state_dict()))
            best, bad_evals = {"valid": metrics, "best_epoch": epoch, "state": state, "logits": spend.logits}, 0
        else:
            bad_evals += 1
        bar.set_postfix(loss=history[-1]["loss"], ndcg10=metrics["ndcg@10"], best=best["best_epoch"])
        if bad_evals >= config.patience or spend.spent:
            break
    bar.close()
    if epochs:
        # the budget reached at the last step of the last epoch is the refit done, not cut
        return {"epochs": epoch, "n_windows": len(w.x), "steps": spend.steps, "logits": spend.logits,
                "out_of_budget": spend.out_of_budget and cut_short,
                "out_of_time": spend.out_of_time and cut_short and not spend.out_of_budget}
    run.item_tower.load_state_dict(best["state"][0])
    run.user_tower.load_state_dict(best["state"][1])
    stopped_by = ("max_train_logits" if spend.out_of_budget else "max_train_s" if spend.out_of_time
                  else "early_stopping" if bad_evals >= config.patience else "max_epochs")
    return _fit_report(run, config, spend, w, stopped_by, epoch, best, history)


def _fit_report(run: Run, config: RecallConfig, spend: _Spend, w: _Windows, stopped_by: str, epoch: int,
                best: dict[str, Any], history: list[dict[str, Any]]) -> dict[str, Any]:
    """The early-stopped fit's report: how long it ran, why it stopped, its best evaluation."""
    steps_per_epoch = -(-len(w.x) // config.batch_size)
    return {"epochs": epoch, "best_epoch": best["best_epoch"], "n_windows": len(w.x), "steps": spend.steps,
            "logits": spend.logits, "best_logits": best["logits"], "positions": int(w.positions.sum()),
            "stopped_by": stopped_by, "converged": stopped_by == "early_stopping",
            "out_of_budget": stopped_by in ("max_train_logits", "max_epochs"), "out_of_time": stopped_by == "max_train_s",
            "loss": "full" if run.log_q is None else "sampled", "valid": best["valid"],
            "settings": training_settings(config, len(run.item_tower.known), steps_per_epoch,
                                          float(w.lengths.mean()) / config.max_len), "history": history}


def training_settings(config: RecallConfig, n_items: int, steps_per_epoch: int, real_share: float) -> dict[str, str]:
    """Each setting that decides how long and how a fit trains, as ``value (why)``: what the train
    report lists, so a reader sees which values were scaled to the data and which were set."""
    bound, why = config.epoch_bound(steps_per_epoch)
    full = config.uses_full_softmax(n_items)
    buckets, buckets_why = config.uses_length_buckets(real_share)
    limit = (f"recall.full_softmax_max_items {config.full_softmax_max_items:,}" if config.loss == "auto"
             else "recall.loss")
    return {
        "max_epochs": f"{bound} ({why})",
        "stopping": f"patience {config.patience} evaluations, every {config.eval_every} epochs, on valid NDCG@10",
        "loss": (f"full softmax ({n_items:,} items; {limit})" if full else
                 f"sampled softmax, {config.n_negatives} negatives with logQ correction ({n_items:,} items; {limit})"),
        "batches": f"{config.batch_size} windows, {steps_per_epoch} steps per epoch",
        "length_buckets": f"{'on' if buckets else 'off'} ({buckets_why})",
        "max_train_logits": "none" if config.max_train_logits is None else f"{config.max_train_logits:g} (set)",
        "max_train_s": "none" if config.max_train_s is None else f"{config.max_train_s:g} s (set; load-dependent)",
    }


@contextmanager
def deterministic_kernels() -> Iterator[None]:
    """Torch's deterministic kernels inside the block, the caller's settings restored after (see
    module doc: Reproducibility). ``warn_only``: an op without one warns rather than stopping a fit.

    Deterministic mode also fills every fresh tensor with NaN by default, a guard against reading
    uninitialised memory that changes no result and cost 2-5% of a training step's CPU (thousands of
    ``fill_`` calls a step); it is off inside the block."""
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory  # type: ignore[attr-defined]
    torch.use_deterministic_algorithms(True, warn_only=before[1] if before[0] else True)  # a caller's strict stays
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.utils.deterministic.fill_uninitialized_memory = fill  # type: ignore[attr-defined]
