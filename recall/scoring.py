"""Batched user vectors and full-ranking evaluation of a two-tower model.

Shared by the trainer (early stopping on valid, final valid/test figures) and the loaded recall
model (``recall.model.RecallModel.user_vectors``, for serving and the evaluator). The recall stage
encodes its one user per request with ``FrozenUserEncoder``, the same arithmetic bit for bit. Full ranking
follows the protocol of ``offline.split``: every catalog item is scored, the input history is
excluded, ties go to the lower item index (``offline.metrics.rank_full``).

Deliberately left out: approximate search (the stage queries the faiss index instead) and
metric definitions (``offline.metrics``).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from offline.metrics import ndcg_at_ranks
from recall.towers import BOS, UserTower, history_batch

EVAL_KS = (10, 50, 200)


@torch.inference_mode()  # no autograd state at all (no_grad still keeps version counters and view tracking)
def user_vectors(
    tower: UserTower, item_vectors: np.ndarray | torch.Tensor, histories: Sequence[np.ndarray],
    attrs: np.ndarray, *, batch_size: int = 512, by_length: bool = False,
) -> np.ndarray:
    """``[n, dim]`` float32 unit user vectors for ``histories`` (item indices, oldest first).

    ``attrs`` is ``[n, 3]`` ``UserVocab`` codes. The tower is put in eval mode (no dropout).
    ``by_length``: encode the users in order of history length, each batch padded only to its
    longest history (the trainer's evaluations, where most histories can be far shorter than
    ``max_len``); padding is never attended to, so the vectors equal the padded ones up to float
    rounding. Off, every batch is padded to ``max_len`` (the served path, bit for bit stable).
    """
    if len(attrs) != len(histories):
        raise ValueError(f"{len(histories)} histories but {len(attrs)} attribute rows")
    if tower.training:  # eval() walks every submodule: a served tower is in eval mode already
        tower.eval()
    table = torch.as_tensor(item_vectors, dtype=torch.float32)
    out = np.zeros((len(histories), tower.dim), dtype=np.float32)
    lengths = np.fromiter((len(h) for h in histories), dtype=np.int64, count=len(histories))
    order = np.argsort(lengths, kind="stable") if by_length else np.arange(len(histories))
    for s in range(0, len(histories), batch_size):
        rows = order[s:s + batch_size]
        width = min(tower.max_len, int(lengths[rows].max(initial=0)) + 1) if by_length else tower.max_len
        seqs = torch.from_numpy(history_batch([histories[r] for r in rows], width))
        codes = torch.as_tensor(np.asarray(attrs, dtype=np.int64)[rows])
        out[rows] = tower.encode(table, seqs, codes).numpy()
    return out


class _Encode(nn.Module):
    """``tower.encode`` over a fixed item table: the one function ``FrozenUserEncoder`` traces."""

    table: torch.Tensor

    def __init__(self, tower: UserTower, table: torch.Tensor) -> None:
        super().__init__()
        self.tower = tower
        self.register_buffer("table", table)

    def forward(self, seqs: torch.Tensor, attrs: torch.Tensor) -> torch.Tensor:
        return self.tower.encode(self.table, seqs, attrs)


class FrozenUserEncoder:
    """One user's vector, equal bit for bit to ``user_vectors`` for that user, at less CPU.

    The eval-mode tower is traced and frozen (TorchScript) once, for the one input shape the served
    path sends: a ``[1, max_len]`` padded sequence (``user_vectors`` pads every batch the same way).
    The traced graph runs the same kernels in the same order without the Python of some thirty module
    calls per forward, about 40% of a served user vector's CPU on ML-100K. Built by the recall stage's
    ``load``; safe to call from many request threads at once (the frozen graph holds no state).

    ``torch.jit.trace`` is deprecated in favour of ``torch.compile`` / ``torch.export``: the first needs
    a C++ toolchain at serving time, the second runs the graph through Python again (slower than eager
    here); the deprecation warning at load is silenced.
    """

    def __init__(self, tower: UserTower, item_vectors: np.ndarray | torch.Tensor) -> None:
        if tower.training:
            tower.eval()
        self.dim, self.max_len = tower.dim, tower.max_len
        table = torch.as_tensor(item_vectors, dtype=torch.float32)
        example = (torch.full((1, tower.max_len), BOS, dtype=torch.int64), torch.zeros((1, 3), dtype=torch.int64))
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the deprecation of torch.jit (see the class docstring)
            self._encode = torch.jit.freeze(torch.jit.trace(_Encode(tower, table).eval(), example, check_trace=False))

    @torch.inference_mode()
    def __call__(self, history: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """``[1, dim]`` float32 unit vector for one ``history`` (item indices in the catalog, oldest
        first) and its ``[3]`` ``UserVocab`` codes."""
        seqs = torch.from_numpy(history_batch([history], self.max_len))
        return self._encode(seqs, torch.as_tensor(np.asarray(codes, dtype=np.int64)[None])).numpy()


def full_ranking_metrics(
    users: np.ndarray, items: np.ndarray, histories: Sequence[np.ndarray], targets: np.ndarray,
    *, chunk: int = 2048,
) -> dict[str, float]:
    """NDCG@10, Recall@10 and candidate Recall@50/@200 of ``users @ items.T``, history excluded.

    Users whose target is negative (no held-out item) are skipped. Only each target's rank is
    needed (``target_ranks``), not the top lists: the figures equal those of ``rank_full``'s lists.
    """
    keep = np.flatnonzero(np.asarray(targets) >= 0)
    if len(keep) == 0:
        raise ValueError("full_ranking_metrics: no user has a target")
    t = np.asarray(targets, dtype=np.int64)[keep]
    ranks = np.concatenate([
        target_ranks(users[keep[s:s + chunk]] @ items.T, [histories[u] for u in keep[s:s + chunk]], t[s:s + chunk])
        for s in range(0, len(keep), chunk)])
    found = ranks >= 0
    out = {"ndcg@10": float(ndcg_at_ranks(np.where(ranks < 10, ranks, -1), k=10).mean())}
    for k in EVAL_KS:  # a catalog smaller than k: every rankable item is among the candidates
        out[f"recall@{k}"] = float((found & (ranks < k)).mean())
    return {name: round(v, 5) for name, v in out.items()}


def target_ranks(scores: np.ndarray, exclude: Sequence[np.ndarray], targets: np.ndarray) -> np.ndarray:
    """0-based rank of each row's target in ``offline.metrics.rank_full``'s order of a score matrix
    ``[n, n_items]`` (history excluded, ties to the lower item index); -1 where the target is excluded.

    >>> target_ranks(np.array([[0.1, 0.5, 0.5, 0.9]]), [np.array([3])], np.array([2])).tolist()
    [1]
    """
    s = np.array(scores, dtype=np.float32)  # a copy: excluded items are overwritten
    if np.isnan(s).any():
        raise ValueError(f"target_ranks: NaN scores in row(s) {np.flatnonzero(np.isnan(s).any(axis=1))[:5]}")
    for row, ex in enumerate(exclude):
        s[row, np.asarray(ex, dtype=np.int64)] = -np.inf
    at = s[np.arange(len(s)), targets][:, None]
    rank = (s > at).sum(axis=1) + ((s == at) & (np.arange(s.shape[1]) < targets[:, None])).sum(axis=1)
    return np.where(at[:, 0] == -np.inf, -1, rank)
