"""The coarse trainer's decisions on the valid groups, each a paired test against an incumbent.

Training fits the ranker once per candidate setting on the same query groups and keeps the
incumbent unless the challenger's per-group NDCG@k on the valid groups beats it with the paired
bootstrap 95% CI above zero (``offline.protocol.gate_verdict``, the rule the fusion gate uses):

- ``choose_dropout``: how much cold-item training (``coarse.cold_item_dropout`` null);
- ``choose_placement``: where items without interactions go (``coarse.new_items: auto``);
- the LLM item-embedding columns (``coarse_rank.llm_gate``) use ``per_group_ndcg`` the same way.

``valid_ndcg`` is the training report's summary of the served fit against recall's order.

Deliberately left out: the fits themselves (``coarse_rank.train``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from coarse_rank.dataset import QueryGroups
from coarse_rank.new_items import placed_scores
from offline.metrics import per_user_metrics
from offline.protocol import gate_verdict


def choose_dropout(dropouts: Sequence[float | str], preds: Sequence[np.ndarray], va: QueryGroups, k: int, seed: int
                   ) -> tuple[int, dict[str, Any]]:
    """(index of the served fit, report) among fits at ``dropouts`` (the cold-item variants' labels, the
    incumbent without cold-item training first; a tie goes to the earlier, simpler one).

    The fit with the best valid NDCG@k is served over the first only when its paired bootstrap
    95% CI over the valid groups lies above zero (``offline.protocol.gate_verdict``): hiding warm
    items' interactions costs the warm items, so it is served only where the valid items hold
    enough new ones to pay for it.
    """
    ndcg = [per_group_ndcg(va, p, k) for p in preds]
    means = [float(n.mean()) if len(n) else 0.0 for n in ndcg]
    out: dict[str, Any] = {"valid_ndcg": {str(d): round(m, 5) for d, m in zip(dropouts, means, strict=True)}}
    best = max(range(len(dropouts)), key=lambda i: (means[i], -i))
    chosen = 0
    if best != 0:
        check = gate_verdict(ndcg[0], ndcg[best], seed)
        out["gate"] = {"challenger": dropouts[best], **{key: check[key] for key in ("mean", "ci95", "p_value")}}
        chosen = best if check["wins"] else 0
    out["chosen"] = dropouts[chosen]
    return chosen, out


def choose_placement(setting: str, pred: np.ndarray, va: QueryGroups, known: np.ndarray, k: int, seed: int
                     ) -> dict[str, Any]:
    """Where the served ranker puts items without interactions (``coarse_rank.new_items``), as a report.

    With ``auto``: recall's place when it beats the model's order on the valid groups beyond the
    paired bootstrap CI (``offline.protocol.gate_verdict``), else the model's; the model's when no
    valid group holds such an item. Any other setting is served as it is.
    """
    if setting != "auto":
        return {"chosen": setting, "why": "coarse.new_items"}
    placed, groups = placed_scores(pred, [c.items for c in va.candidates],
                                   [c.score("recall") for c in va.candidates], known)
    if groups == 0:
        return {"chosen": "model", "why": "no valid group holds an item without interactions"}
    model, recall = per_group_ndcg(va, pred, k), per_group_ndcg(va, placed, k)
    check = gate_verdict(model, recall, seed)
    return {"chosen": "recall_place" if check["wins"] else "model", "groups_with_new_items": groups,
            "valid_ndcg": {"model": round(float(model.mean()), 5), "recall_place": round(float(recall.mean()), 5)},
            "gate": {key: check[key] for key in ("mean", "ci95", "p_value")}}


def per_group_ndcg(va: QueryGroups, pred: np.ndarray, k: int) -> np.ndarray:
    """NDCG@k of each valid group's label in the order of ``pred``."""
    offsets = np.concatenate([[0], np.cumsum(va.sizes)])
    top = np.full((len(va), k), -1, np.int64)
    for g, cands in enumerate(va.candidates):
        order = cands.items[np.argsort(-pred[offsets[g]:offsets[g + 1]], kind="stable")][:k]
        top[g, :len(order)] = order
    return per_user_metrics(top, va.labels, k)[f"ndcg@{k}"] if len(va) else np.zeros(0)


def valid_ndcg(va: QueryGroups, pred: np.ndarray, k: int, n_users: int) -> dict[str, float]:
    """NDCG@k of the coarse order vs the recall order over all valid queries (a miss counts 0)."""
    coarse, recall = np.full((len(va), k), -1, np.int64), np.full((len(va), k), -1, np.int64)
    offsets = np.concatenate([[0], np.cumsum(va.sizes)])
    for g, cands in enumerate(va.candidates):
        s = pred[offsets[g]:offsets[g + 1]]
        by_coarse = cands.items[np.argsort(-s, kind="stable")][:k]
        by_recall = (cands.sorted_by("recall") if "recall" in cands.scores else cands).items[:k]
        coarse[g, :len(by_coarse)], recall[g, :len(by_recall)] = by_coarse, by_recall
    key = f"ndcg@{k}"
    return {
        f"valid_{key}_coarse": float(per_user_metrics(coarse, va.labels, k)[key].sum() / max(n_users, 1)),
        f"valid_{key}_recall": float(per_user_metrics(recall, va.labels, k)[key].sum() / max(n_users, 1)),
    }
