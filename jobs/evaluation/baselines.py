"""Strong simple baselines every evaluation reports beside the cascade, on the same split.

A cascade that does not beat a co-occurrence count is not worth its training time, and on some
catalogs it barely does; so every eval report ranks the full catalog with three simple models fitted
on exactly what the cascade may see before the phase's targets, and says whether the served order
beats the best of them beyond the paired bootstrap's CI. The served list obeys the compliance rules and
the baselines do not, so the report also judges the final list with every rule off against the same
baseline (``without_rules``): a served order that loses only to the rules' cost says so.

The baselines:

- ``covisit_last``: item-to-item co-occurrence (``offline.item_neighbours.covisitation``, the recall
  config's window and backward weight) queried from the user's last ``covisit_last_n`` items with
  recency-decayed weights: the session-kNN baseline of Ludewig & Jannach (2018).
- ``ease``: the EASE^R item model alone (Steck 2019; item-kNN above ``ease_max_items`` items, as the
  channel does), queried from the user's recency-decayed last ``item_model_last_n`` items.
- ``popularity_recent``: interaction counts over the most recent ``RECENT_SHARE`` of the visible
  events by timestamp (ties broken by all-time popularity). Where a dataset's timestamps are only
  each user's positions (no clock), "recent" means late in users' sequences; the report keeps it.

The two neighbour models break ties (users whose last items have no neighbour) by popularity, as a
deployed fallback would. Deliberately left out: tuning the baselines on valid (they run at the
recall stage's defaults, the same ones the cascade's own channels use).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import sparse

from offline.baselines import input_histories
from offline.bootstrap import paired_bootstrap
from offline.item_neighbours import NeighbourChannel, covisitation, item_model
from offline.metrics import per_user_metrics, rank_full
from offline.split import Phase, Split
from recall.config import RecallConfig

RECENT_SHARE = 0.2  # share of the visible events, newest first, that popularity_recent counts
_TIE_BREAK = 1e-6  # weight of normalised popularity added to neighbour scores (below any real weight)
_CHUNK_USERS = 1024


def visible_sequences(split: Split, phase: Phase) -> list[np.ndarray]:
    """Per user, the time-ordered items a model may learn from before ``phase``'s targets."""
    return input_histories(split, phase)


def recent_popularity(split: Split, phase: Phase, share: float = RECENT_SHARE) -> np.ndarray:
    """Counts over the newest ``share`` of the visible events, plus a tie-break by all-time counts."""
    items = split.train["item_idx"].to_numpy(dtype=np.int64)
    ts = split.train["timestamp"].to_numpy(dtype=np.float64)
    if phase == "test" and len(split.valid_ts) == len(split.valid):
        keep = split.valid >= 0
        items = np.concatenate([items, split.valid[keep]])
        ts = np.concatenate([ts, split.valid_ts[keep].astype(np.float64)])
    total = np.bincount(items, minlength=split.n_items).astype(np.float64)
    if len(ts) == 0:
        return total
    cut = np.quantile(ts, 1.0 - share)
    recent = np.bincount(items[ts >= cut], minlength=split.n_items).astype(np.float64)
    return recent + total / (total.max() + 1.0)  # all-time counts only order items the recent window ties


def neighbour_rankings(channel: NeighbourChannel, histories: list[np.ndarray], popularity: np.ndarray,
                       k: int) -> np.ndarray:
    """Each user's top ``k`` by ``channel``'s scores, history excluded, ties by popularity then index
    (``-1`` padding): how the neighbour baselines rank."""
    tie = _TIE_BREAK * popularity / max(float(popularity.max()), 1.0)
    out = np.empty((len(histories), k), dtype=np.int64)
    for start in range(0, len(histories), _CHUNK_USERS):
        rows = histories[start:start + _CHUNK_USERS]
        query = sparse.vstack([channel.query(h) for h in rows]).tocsr()
        scores = (query @ channel.weights).toarray().astype(np.float64) + tie
        out[start:start + len(rows)] = rank_full(scores, rows, k)
    return out


def ease_channel(split: Split, phase: Phase, config: RecallConfig | None = None,
                 sequences: list[np.ndarray] | None = None) -> NeighbourChannel:
    """The EASE baseline's item-item model (EASE up to ``ease_max_items`` items, item-kNN beyond),
    fitted on what ``phase`` may see (``sequences``: those visible sequences, when already built)."""
    cfg = config or RecallConfig()
    seqs = visible_sequences(split, phase) if sequences is None else sequences
    _, weights = item_model(seqs, split.n_items, kind="ease", top_k=cfg.neighbours, l2=cfg.ease_l2,
                            shrink=cfg.knn_shrink, max_dense=cfg.ease_max_items)
    return NeighbourChannel("ease", weights, cfg.item_model_last_n)


def baseline_rankings(split: Split, phase: Phase, k: int, config: RecallConfig | None = None
                      ) -> dict[str, np.ndarray]:
    """``{name: [n_users, k] rankings}`` of every baseline, fitted on what ``phase`` may see."""
    cfg = config or RecallConfig()
    seqs = visible_sequences(split, phase)
    histories = input_histories(split, phase)
    popularity = split.item_popularity(phase)
    covisit = NeighbourChannel("covisit_last", covisitation(
        seqs, split.n_items, window=cfg.covisit_window, backward=cfg.covisit_backward, top_k=cfg.neighbours),
        cfg.covisit_last_n)
    ease = ease_channel(split, phase, cfg, seqs)
    recent = recent_popularity(split, phase)
    out = {"covisit_last": neighbour_rankings(covisit, histories, popularity, k),
           "ease": neighbour_rankings(ease, histories, popularity, k)}
    rows = np.empty((split.n_users, k), dtype=np.int64)
    for start in range(0, split.n_users, _CHUNK_USERS):
        chunk = histories[start:start + _CHUNK_USERS]
        rows[start:start + len(chunk)] = rank_full(np.broadcast_to(recent, (len(chunk), len(recent))), chunk, k)
    out["popularity_recent"] = rows
    return out


def baseline_metrics(split: Split, phase: Phase, k: int, config: RecallConfig | None = None
                     ) -> dict[str, dict[str, np.ndarray]]:
    """Per-user NDCG@k / Recall@k / MRR@k of every baseline (the eval's per-user table rows)."""
    targets = split.targets(phase)
    return {name: per_user_metrics(r, targets, k) for name, r in baseline_rankings(split, phase, k, config).items()}


def versus_best_baseline(per_user: dict[str, dict[str, np.ndarray]], baselines: list[str], served: str, k: int, *,
                         n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Whether ``served`` beats the best baseline (by mean NDCG@k) beyond the paired bootstrap CI.

    ``verdict``: ``beats`` (CI above 0), ``ties`` (CI spans 0) or ``loses`` (CI below 0).
    """
    metric = f"ndcg@{k}"
    best = max(baselines, key=lambda name: float(np.mean(per_user[name][metric])))
    r = paired_bootstrap(per_user[best][metric], per_user[served][metric], n_boot=n_boot, seed=seed)
    lo, hi = r["ci95"]
    verdict = "beats" if lo > 0 else "loses" if hi < 0 else "ties"
    return {"best": best, "served": served, metric: {"mean": round(r["mean"], 5), "ci95": [round(lo, 5), round(hi, 5)],
                                                     "p_value": round(r["p_value"], 4)}, "verdict": verdict}


def baseline_warnings(report: dict[str, Any]) -> list[str]:
    """The eval report's warning when the served order does not beat the best baseline beyond its CI."""
    base = report.get("baselines")
    if not base or base["verdict"] == "beats":
        return []
    how = "does not beat" if base["verdict"] == "ties" else "is below"
    line = (f"the served order {how} the simple baseline {base['best']!r}: NDCG@10 {_delta_text(base)}; "
            "see 'baselines' in the report")
    free = base.get("without_rules")
    if free and free["verdict"] == "beats":
        line += (f"; with every rule off it beats it ({_delta_text(free)}), so the gap is what the rules in force "
                 "cost (see 'policy_costs')")
    return [line]


def _delta_text(section: dict[str, Any]) -> str:
    """``+0.0123 (95% CI +0.0010 to +0.0240)`` for a ``versus_best_baseline`` section."""
    delta = next(v for k, v in section.items() if k.startswith("ndcg@"))
    return f"{delta['mean']:+.4f} (95% CI {delta['ci95'][0]:+.4f} to {delta['ci95'][1]:+.4f})"
