"""The recall stage's extra channels: fit, save, and their depth shares gated on valid.

``recall.train.train_two_tower`` (the one training entry point of the recall stage) calls
``train_channels`` after the two-tower when ``RecallConfig.extra_channels`` is not empty:

1. fit each channel's matrix (``offline.item_neighbours``) on the *same* sequences the two-tower
   trained on (for ``recall_holdout`` that is the shortened ones, so no coarse-ranker label
   feeds a channel) and save it as ``<recall_dir>/channels/<name>.npz``;
2. load the freshly written model (``recall.model``), build every channel's own list once per early-stopping
   user (history = training sequence, target = the held-out next item: the *valid* item for
   ``recall/``, never a test item), and gate the channel shares as fusion gates its weights:
   the users are dealt into ``GATE_FOLDS`` seeded folds; for each fold, the shares that maximise
   candidate recall at the stage depth over a small grid (``SHARE_GRID`` per channel, the two-tower
   keeping at least ``MIN_TWO_TOWER_SHARE``; ties to the smaller total extra share) are chosen on
   the other folds and scored on that fold's users, so every user judges a choice it took no part
   in. The shares chosen on every user are served only if this procedure beats the incumbent, no
   extra share (two-tower and popularity), over all users pooled with a paired bootstrap 95% CI
   above zero. Choosing and testing on the same users served shares that had won by noise: on
   ML-100K with a softmax temperature of 0.1 or 0.2 the tuned shares gained +0.003 on valid and
   lost 0.01-0.03 of test candidate recall on every seed (``docs/decisions/0010-recall-depth-200.md``);
   testing on one held-out half only had no power on a few hundred users
   (``docs/decisions/0013-channel-gate-pooled-folds.md``);
3. write ``channels.json``: the shares, the whole grid's recall, each channel's own
   candidate recall at the depth, and the matrix sizes;
4. with ``RecallConfig.refit`` all of that happens in ``recall/early_stopped/``, and
   ``refit_channels`` then fits the served channels on the refit sequences (training + valid
   item) and serves them with the shares gated there (``shares_from``), never gated again on
   the valid items they now hold.

``channel_candidate_recall`` gives the same per-channel figures on any phase for the eval
report. Loading the channels back is ``recall.model.load_channels``. Deliberately left out: tuning the popularity share (kept from the config) and any
score-level blending (the coarse ranker weighs channels through its features).
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from scipy import sparse

from offline.item_neighbours import covisitation, item_counts, item_model
from offline.protocol import GATE_MIN_USERS, SALT_CHANNEL_GATE, gate_folds, gate_verdict, out_of_fold
from recall.artifacts import CHANNELS_DIR, CHANNELS_FILE, VECTORS_FILE
from recall.channels import Channel, ChannelQuotas, PopularityChannel, clean_channel, priority_items
from recall.config import RecallConfig
from recall.model import RecallModel
from recsys.atomic import atomic_write_json
from recsys.cluster import connected

SHARE_GRID = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)
MIN_TWO_TOWER_SHARE = 0.3


def fit_channels(sequences: list[np.ndarray], n_items: int, config: RecallConfig) -> dict[str, Any]:
    """``{name: (kind, W, last_n)}`` for every channel ``config`` turns on (see ``offline.item_neighbours``);
    inside a Ray session the counts are map-reduced on the cluster (``offline.distributed_counts``, the
    same weights)."""
    count_covisits, fit_item_model = covisitation, item_model
    if connected():
        from offline import distributed_counts  # lazy: only with a cluster

        count_covisits, fit_item_model = distributed_counts.covisitation, distributed_counts.item_model
    out: dict[str, Any] = {}
    if config.covisit_channel:
        w = count_covisits(sequences, n_items, window=config.covisit_window, backward=config.covisit_backward,
                           top_k=config.neighbours)
        out["covisit"] = ("covisit", w, config.covisit_last_n)
    if config.item_model != "off":
        kind, w = fit_item_model(sequences, n_items, kind=config.item_model, top_k=config.neighbours,
                                 l2=config.ease_l2, shrink=config.knn_shrink, max_dense=config.ease_max_items)
        out["item_model"] = (kind, w, config.item_model_last_n)
    return out


def train_channels(split: Any, stage_root: Path, subdir: str, sequences: list[np.ndarray], targets: np.ndarray,
                   config: RecallConfig, depth: int, seed: int = 42) -> dict[str, Any]:
    """Fit, save and tune the extra channels of ``<stage_root>/<subdir>`` (see module doc); the report.

    ``<stage_root>/<subdir>`` must hold the two-tower artifacts just written; ``split`` may live
    in memory only (the model's lists use the popularity of ``sequences``, not ``<stage_root>/split``).
    """
    recall_dir = Path(stage_root) / subdir
    meta = _fit_and_save(recall_dir, sequences, config)
    _write(recall_dir, meta)  # provisional (zero shares) so the model loads for tuning
    config = config.model_copy(update={"channel_shares": None})
    model = RecallModel.load(recall_dir, config)
    # popularity as of the tuning targets: the events of the sequences the models learnt from (for recall/ the
    # valid phase's counts; for recall_holdout those without its held-out targets), never a target's own event
    popularity = PopularityChannel(item_counts(sequences, split.n_items).astype(np.float64))
    users = np.flatnonzero(np.asarray(targets) >= 0)
    lists_of = functools.partial(model.channel_lists, popularity=popularity, depth=depth)
    lists, excludes = channel_lists_for(model, lists_of, [sequences[u] for u in users],
                                        [split.user_attrs(u) for u in users])
    tgt = np.asarray(targets)[users]
    meta.update(tune_shares(ChannelQuotas(config, depth, model.tuned_shares), lists, excludes, tgt, seed))
    meta["own_recall"] = own_recall(lists, excludes, tgt, depth)
    _write(recall_dir, meta)
    return {k: v for k, v in meta.items() if k != "grid"}


def refit_channels(recall_dir: Path, tuned_dir: Path, sequences: list[np.ndarray], config: RecallConfig
                   ) -> dict[str, Any]:
    """Fit the channels of the refit model in ``recall_dir`` on its ``sequences`` and serve them with
    the shares gated in ``tuned_dir`` (the early-stopped model's, ``recall.train``'s refit); the report.

    The shares are not gated again: the refit sequences hold the valid items, the only targets to gate on.
    """
    tuned = json.loads((Path(tuned_dir) / CHANNELS_FILE).read_text())
    meta = _fit_and_save(Path(recall_dir), sequences, config)
    meta.update({"shares": {name: float(tuned["shares"].get(name, 0.0)) for name in meta["channels"]},
                 "shares_from": Path(tuned_dir).name, "gate": tuned.get("gate", {})})
    _write(Path(recall_dir), meta)
    return meta


def _fit_and_save(recall_dir: Path, sequences: list[np.ndarray], config: RecallConfig) -> dict[str, Any]:
    """Fit every channel on ``sequences``, save each matrix; the metadata with zero shares."""
    n_items = len(np.load(recall_dir / VECTORS_FILE, mmap_mode="r"))
    fitted = fit_channels(sequences, n_items, config)
    (recall_dir / CHANNELS_DIR).mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {"channels": {}, "shares": {name: 0.0 for name in fitted}}
    for name, (kind, w, last_n) in fitted.items():
        sparse.save_npz(recall_dir / CHANNELS_DIR / f"{name}.npz", w)
        meta["channels"][name] = {"kind": kind, "last_n": last_n, "nnz": int(w.nnz),
                                  "mbytes": round((w.data.nbytes + w.indices.nbytes + w.indptr.nbytes) / 2**20, 2)}
    return meta


def channel_lists_for(model: RecallModel, lists_of: Callable[[np.ndarray, np.ndarray, np.ndarray], list[Channel]],
                      histories: list[np.ndarray], attrs: list[dict[str, Any]],
                      ) -> tuple[list[list[Any]], list[np.ndarray]]:
    """Every channel's own list per history (``lists_of(history, exclude, vector)``: a
    ``RecallModel.channel_lists`` at some popularity and depth), user vectors in one batch."""
    known = [model.known(h) for h in histories]
    vectors = model.user_vectors(known, attrs)
    excludes = [np.unique(np.asarray(h, dtype=np.int64)) for h in histories]
    lists = [lists_of(h, ex, vectors[i:i + 1]) for i, (h, ex) in enumerate(zip(known, excludes, strict=True))]
    return lists, excludes


def own_recall(lists: list[list[Any]], excludes: list[np.ndarray], targets: np.ndarray, depth: int
               ) -> dict[str, float]:
    """Share of users whose target is in each channel's own top ``depth`` once excluded items
    are dropped (the channel's candidate recall, as if it filled every slot)."""
    names = [name for name, _, _ in lists[0]] if lists else []
    hits = np.zeros(len(names))
    for ls, ex, t in zip(lists, excludes, targets, strict=True):
        hits += [t in clean_channel(ids, sc, ex, name)[0][:depth] for name, ids, sc in ls]
    return {f"{name}@{depth}": round(float(hits[c] / max(len(lists), 1)), 5) for c, name in enumerate(names)}


def tune_shares(mix: ChannelQuotas, lists: list[list[Any]], excludes: list[np.ndarray], targets: np.ndarray,
                seed: int = 42) -> dict[str, Any]:
    """The gated grid search of the module doc: ``{"shares", "valid_recall", "gate", "grid"}``
    (``grid``: every grid point's recall on every user; ``gate``: the shares chosen on every user
    (``challenger``), each fold's choice and the pooled paired CI; ``valid_recall``: the served
    shares' recall on every user)."""
    names = list(mix.config.extra_channels)
    room = 1.0 - mix.config.popularity_share - MIN_TWO_TOWER_SHARE
    grid = [dict(zip(names, combo, strict=True)) for combo in itertools.product(SHARE_GRID, repeat=len(names))
            if sum(combo) <= room + 1e-9]
    cleaned = [[clean_channel(ids, sc, ex, name)[0] for name, ids, sc in ls] for ls, ex in zip(lists, excludes, strict=True)]

    def hits(shares: dict[str, float]) -> np.ndarray:
        quotas = mix.quotas(names, cold=False, shares=shares)
        if mix.config.merge_order == "priority":
            caps = [quotas[name] for name, _, _ in lists[0]] if lists else []
            found = [t in priority_items(cl, caps, mix.depth) for cl, t in zip(cleaned, targets, strict=True)]
        else:
            found = [t in mix.merge(ls, ex, cold=False, shares=shares).items
                     for ls, ex, t in zip(lists, excludes, targets, strict=True)]
        return np.asarray(found, dtype=np.float64)

    per_user = np.array([hits(shares) for shares in grid]).reshape(len(grid), len(targets))
    incumbent = {name: 0.0 for name in names}
    base = per_user[grid.index(incumbent)]
    folds = gate_folds(len(targets), seed, salt=SALT_CHANNEL_GATE)

    def best_on(users: np.ndarray) -> int:
        recall = per_user[:, users].mean(axis=1) if len(users) else np.zeros(len(grid))
        return max(range(len(grid)), key=lambda i: (recall[i], -sum(grid[i].values())))

    results = [{"shares": shares, "recall": round(float(h.mean()) if len(h) else 0.0, 5)}
               for shares, h in zip(grid, per_user, strict=True)]
    best = best_on(np.arange(len(targets)))
    gate: dict[str, Any] = {"challenger": grid[best], "served": "incumbent"}
    served = incumbent
    if len(targets) < 2 * GATE_MIN_USERS:
        gate["why"] = f"{len(targets)} users: the gate needs {2 * GATE_MIN_USERS}"
    elif grid[best] != incumbent:
        chosen, procedure = out_of_fold(per_user, best_on, folds)
        check = gate_verdict(base, procedure, seed)
        gate.update({k: check[k] for k in ("mean", "ci95", "p_value", "n_users")})
        gate["fold_choices"] = [grid[i] for i in chosen]
        if check["wins"]:
            served, gate["served"] = grid[best], "challenger"
    valid_recall = float(per_user[grid.index(served)].mean()) if len(targets) else 0.0
    return {"shares": served, "valid_recall": round(valid_recall, 5), "gate": gate, "grid": results}


def channel_candidate_recall(stage: Any, split: Any, phase: str) -> dict[str, float]:
    """Each channel's own candidate recall at the stage depth, and the merged list's, on ``phase``.

    For the eval report: ``report["channel_recall"] = channel_candidate_recall(pipeline.stage("recall"),
    split, phase)``. A user with an empty history counts as a miss for the history-based channels.
    """
    histories = [split.history(u, phase) for u in range(split.n_users)]
    attrs = [split.user_attrs(u) for u in range(split.n_users)]
    lists, excludes = channel_lists_for(stage.model, stage.channel_lists, histories, attrs)
    targets = np.asarray(split.targets(phase))
    out = own_recall(lists, excludes, targets, stage.depth)
    merged = [t in stage.mix.merge(ls, ex, cold=not len(stage.model.known(h))).items
              for ls, ex, h, t in zip(lists, excludes, histories, targets, strict=True)]
    out[f"merged@{stage.depth}"] = round(float(np.mean(merged)), 5)
    return out


def _write(recall_dir: Path, meta: dict[str, Any]) -> None:
    atomic_write_json(recall_dir / CHANNELS_FILE, meta)
