"""The two towers (torch): item features -> item vector, recent history -> user vector.

Item tower: item-id embedding + projected sentence embedding of the title/text + projected
multi-hot categories + audience and release-decade embeddings, summed and L2-normalised.
An item with no training interaction (``known`` false: a new item) gets no id embedding, so its
vector is its content alone and lands beside warm items of similar content; in training, the
id embedding of a known item is dropped with probability ``id_dropout`` (as DropoutNet, Volkovs
et al. 2017) so the content part learns to place an item on its own.

User tower: a SASRec-style encoder (Kang & McAuley 2018, "Self-Attentive Sequential
Recommendation"): the item-tower vectors of the user's most recent ``max_len`` items plus
learned recency-position embeddings go through causal pre-LN self-attention blocks; the
output at position t predicts item t+1, so training scores every position at once. A
learned BOS token opens every history short enough to fit, which gives a user with an empty
history a well-defined vector; the user's attribute embeddings (age bucket, gender,
occupation, each with an "unknown" slot) are added to every output before normalisation.

Both outputs are unit vectors, so the faiss inner-product index ranks by cosine; training
divides the cosine by a temperature (Yi et al. 2019). Sequences are left-padded index
arrays in which ``PAD`` marks padding and ``BOS`` the start token (see ``history_batch``).

Deliberately left out: a user-id embedding (the tower stays inductive: new users work
without retraining) and bidirectional (BERT4Rec) training.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from recall.features import N_AUDIENCE, N_YEAR_BUCKETS, ItemFeatures

PAD, BOS = -1, -2


def history_batch(histories: Sequence[np.ndarray], max_len: int) -> np.ndarray:
    """``[n, max_len]`` int64 user-tower inputs: BOS + history, last ``max_len`` kept, left-padded.

    >>> history_batch([np.array([4, 5]), np.array([], dtype=np.int64), np.array([1, 2, 3, 4])], 3).tolist()
    [[-2, 4, 5], [-1, -1, -2], [2, 3, 4]]
    """
    out = np.full((len(histories), max_len), PAD, dtype=np.int64)
    for row, hist in enumerate(histories):
        seq = np.concatenate([[BOS], np.asarray(hist, dtype=np.int64)])[-max_len:]
        out[row, max_len - len(seq):] = seq
    return out


class ItemTower(nn.Module):
    """Item features -> unit vectors. Features live in non-persistent buffers (not in state_dict)."""

    category_ptr: torch.Tensor
    category_ids: torch.Tensor
    category_weights: torch.Tensor
    audience: torch.Tensor
    year: torch.Tensor
    text: torch.Tensor
    known: torch.Tensor

    def __init__(self, features: ItemFeatures, dim: int, dropout: float = 0.0,
                 known: np.ndarray | None = None, id_dropout: float = 0.0) -> None:
        super().__init__()
        n_items = features.n_items
        self.id_emb = nn.Embedding(n_items, dim)
        nn.init.normal_(self.id_emb.weight, std=dim**-0.5)
        known_t = torch.ones(n_items, dtype=torch.bool) if known is None else torch.from_numpy(np.asarray(known, bool))
        if len(known_t) != n_items:
            raise ValueError(f"ItemTower: known has {len(known_t)} entries for {n_items} items")
        self.register_buffer("known", known_t, persistent=False)
        self.id_dropout = float(id_dropout)
        # the multi-hot categories as sparse rows (CSR): an item has a few of hundreds of categories, and the
        # dense [items, categories] product was the largest part of a full-softmax step on such a catalog
        rows, cols = np.nonzero(features.categories)
        ptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n_items))])
        self.register_buffer("category_ptr", torch.from_numpy(ptr.astype(np.int64)), persistent=False)
        self.register_buffer("category_ids", torch.from_numpy(cols.astype(np.int64)), persistent=False)
        self.register_buffer("category_weights", torch.from_numpy(features.categories[rows, cols].astype(np.float32)),
                             persistent=False)
        self.register_buffer("audience", torch.from_numpy(features.audience), persistent=False)
        self.register_buffer("year", torch.from_numpy(features.year), persistent=False)
        self.category_proj = nn.Linear(features.categories.shape[1], dim, bias=False) if features.categories.shape[1] else None
        self.audience_emb = nn.Embedding(N_AUDIENCE, dim)
        self.year_emb = nn.Embedding(N_YEAR_BUCKETS, dim)
        for emb in (self.audience_emb, self.year_emb):
            nn.init.normal_(emb.weight, std=0.1 * dim**-0.5)
        self.text_proj: nn.Linear | None = None
        if features.text is not None:
            self.register_buffer("text", torch.from_numpy(features.text), persistent=False)
            self.text_proj = nn.Linear(features.text.shape[1], dim, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        """``[m] item indices -> [m, dim]`` unit vectors."""
        keep = self.known[items]
        if self.training and self.id_dropout > 0:
            keep = keep & (torch.rand(keep.shape, device=keep.device) >= self.id_dropout)
        x = self.id_emb(items) * keep.unsqueeze(-1) + self.audience_emb(self.audience[items]) + self.year_emb(self.year[items])
        if self.category_proj is not None:
            x = x + self._categories(items, self.category_proj)
        if self.text_proj is not None:
            x = x + self.text_proj(self.text[items])
        return F.normalize(self.dropout(x), dim=-1)

    def _categories(self, items: torch.Tensor, proj: nn.Linear) -> torch.Tensor:
        """``[m, dim]``: ``proj`` of ``items``' multi-hot category rows, as a weighted sum of the
        projection's columns over each item's categories (equal to ``proj(multi_hot)``)."""
        start = self.category_ptr[items]
        count = self.category_ptr[items + 1] - start
        offsets = torch.cumsum(count, 0) - count
        flat = torch.repeat_interleave(start - offsets, count) + torch.arange(int(count.sum()), device=items.device)
        return F.embedding_bag(self.category_ids[flat], proj.weight.t().contiguous(), offsets.reshape(-1),
                               mode="sum", per_sample_weights=self.category_weights[flat])

    def all_items(self, chunk: int = 65_536) -> torch.Tensor:
        """Vectors of the whole catalog, computed in chunks."""
        n = self.id_emb.num_embeddings
        idx = torch.arange(n, device=self.id_emb.weight.device)
        return torch.cat([self(idx[s:s + chunk]) for s in range(0, n, chunk)])


class _Block(nn.Module):
    """Pre-LN transformer block: causal multi-head attention, then a d -> d GELU feed-forward (as SASRec)."""

    def __init__(self, dim: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads, self.dropout = n_heads, dropout
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.ffn = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        b, length, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, length, 3, self.n_heads, dim // self.n_heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, dropout_p=self.dropout if self.training else 0.0
        )
        x = x + self.drop(self.proj(att.transpose(1, 2).reshape(b, length, dim)))
        return x + self.drop(self.ffn(self.norm2(x)))


class UserTower(nn.Module):
    """Recent history (+ attributes) -> one unit vector per position (SASRec-style, causal)."""

    def __init__(
        self, dim: int, max_len: int, n_blocks: int, n_heads: int, dropout: float,
        attr_sizes: tuple[int, int, int],
    ) -> None:
        super().__init__()
        self.dim, self.max_len = dim, max_len
        self.bos = nn.Parameter(torch.randn(dim) * dim**-0.5)
        self.pos_emb = nn.Embedding(max_len, dim)  # index 0 = the most recent position
        nn.init.normal_(self.pos_emb.weight, std=0.02)
        attr_embs = [nn.Embedding(size, dim) for size in attr_sizes]
        for emb in attr_embs:
            nn.init.normal_(emb.weight, std=0.02)
        self.attr_embs = nn.ModuleList(attr_embs)
        self.blocks = nn.ModuleList(_Block(dim, n_heads, dropout) for _ in range(n_blocks))
        self.norm = nn.LayerNorm(dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, item_vectors: torch.Tensor, seqs: torch.Tensor, attrs: torch.Tensor) -> torch.Tensor:
        """Per-position user vectors ``[b, L, dim]``.

        ``item_vectors[i]`` is item i's tower output; ``seqs`` ``[b, L]`` indexes it (with
        ``PAD``/``BOS``, left-padded, ``L <= max_len``); ``attrs`` ``[b, 3]`` are
        ``UserVocab`` codes. Padded positions produce finite values that callers ignore.
        """
        b, length = seqs.shape
        if length > self.max_len:
            raise ValueError(f"sequence length {length} exceeds the user tower's max_len {self.max_len}")
        valid = seqs != PAD
        x = item_vectors[seqs.clamp(min=0)] * math.sqrt(self.dim)
        x = torch.where((seqs == BOS)[..., None], self.bos * math.sqrt(self.dim), x)
        positions = torch.arange(length - 1, -1, -1, device=seqs.device)
        x = (x + self.pos_emb(positions)) * valid[..., None]
        x = self.drop(x)
        causal = torch.ones(length, length, dtype=torch.bool, device=seqs.device).tril()
        # Padding is never attended to, except by itself (a row with nothing to attend is NaN).
        allowed = causal & (valid[:, None, :] | torch.eye(length, dtype=torch.bool, device=seqs.device))
        allowed = allowed[:, None]
        for block in self.blocks:
            x = block(x, allowed)
        attr = sum(emb(attrs[:, j]) for j, emb in enumerate(self.attr_embs))
        return F.normalize(self.norm(x) + attr[:, None, :], dim=-1)

    def encode(self, item_vectors: torch.Tensor, seqs: torch.Tensor, attrs: torch.Tensor) -> torch.Tensor:
        """The user vector ``[b, dim]``: the output at the last (most recent) position."""
        return self(item_vectors, seqs, attrs)[:, -1]
