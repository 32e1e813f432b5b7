"""Batched user vectors and full-ranking evaluation of a two-tower model.

Shared by the trainer (early stopping on valid, final valid/test figures) and the recall
stage (``RecallStage.user_vectors`` for the evaluator). Full ranking follows the protocol
of ``offline.split``: every catalog item is scored, the input history is excluded, ties go
to the lower item index (``offline.metrics.rank_full``).

Deliberately left out: approximate search (the stage queries the faiss index instead) and
metric definitions (``offline.metrics``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from offline.metrics import candidate_recall, per_user_metrics, rank_full, summarize
from recall.towers import UserTower, history_batch

EVAL_KS = (10, 50, 200)


@torch.no_grad()
def user_vectors(
    tower: UserTower, item_vectors: np.ndarray | torch.Tensor, histories: Sequence[np.ndarray],
    attrs: np.ndarray, *, batch_size: int = 512,
) -> np.ndarray:
    """``[n, dim]`` float32 unit user vectors for ``histories`` (item indices, oldest first).

    ``attrs`` is ``[n, 3]`` ``UserVocab`` codes. The tower is put in eval mode (no dropout).
    """
    if len(attrs) != len(histories):
        raise ValueError(f"{len(histories)} histories but {len(attrs)} attribute rows")
    if tower.training:  # eval() walks every submodule: a served tower is in eval mode already
        tower.eval()
    table = torch.as_tensor(item_vectors, dtype=torch.float32)
    out = np.zeros((len(histories), tower.dim), dtype=np.float32)
    for s in range(0, len(histories), batch_size):
        seqs = torch.from_numpy(history_batch(histories[s:s + batch_size], tower.max_len))
        codes = torch.as_tensor(np.asarray(attrs[s:s + batch_size], dtype=np.int64))
        out[s:s + len(seqs)] = tower.encode(table, seqs, codes).numpy()
    return out


def full_ranking_metrics(
    users: np.ndarray, items: np.ndarray, histories: Sequence[np.ndarray], targets: np.ndarray,
    *, chunk: int = 2048,
) -> dict[str, float]:
    """NDCG@10, Recall@10 and candidate Recall@50/@200 of ``users @ items.T``, history excluded.

    Users whose target is negative (no held-out item) are skipped.
    """
    keep = np.flatnonzero(np.asarray(targets) >= 0)
    if len(keep) == 0:
        raise ValueError("full_ranking_metrics: no user has a target")
    k_max = min(max(EVAL_KS), items.shape[0])
    rankings = np.zeros((len(keep), k_max), dtype=np.int64)
    for s in range(0, len(keep), chunk):
        rows = keep[s:s + chunk]
        scores = users[rows] @ items.T
        rankings[s:s + len(rows)] = rank_full(scores, [histories[u] for u in rows], k_max)
    t = np.asarray(targets)[keep]
    out = summarize(per_user_metrics(rankings, t, k=10))
    for k in EVAL_KS[1:]:
        out[f"recall@{k}"] = candidate_recall(rankings[:, :k], t)
    return {name: round(v, 5) for name, v in out.items() if not name.startswith("mrr")}
