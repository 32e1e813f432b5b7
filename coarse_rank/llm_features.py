"""LLM-embedding coarse features: how close a candidate's LLM item embedding is to the user's recent items.

With ``CoarseConfig.llm_embedding_features`` true the builder adds the ``LLM_EMBEDDING_FEATURES``
columns, computed from ``ItemEmbeddings`` (one unit row per item, the LLM's pooled hidden states
through the 256-d projection; ``jobs.tagging.embed.coarse_item_embeddings`` makes them free of the
coarse ranker's train labels). With ``auto`` training decides per catalog whether they are worth
serving (``coarse_rank.llm_gate``). The recent items are the last ``CoarseConfig.last_n`` of the
history, as for the other similarity features. One matrix product per request, no loop over
candidates: ``[n_candidates, dim] @ [dim, last_n]``.

The embeddings are saved with the fitted builder (``arrays`` / ``from_arrays``, inside
``features.npz``), so training and serving compute the columns from the same array with the
same function, and serving never reads ``<artifact_dir>/tags/``.

Deliberately left out: where the embeddings come from (``jobs.tagging.hidden_states``,
``jobs.coarse_tags``) and the LLM tag features (``coarse_rank.item_tags``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from coarse_rank.config import CoarseConfig

PREFIX = "llmemb_"  # key prefix of the arrays inside features.npz

# NaN without a history item in the fitted catalog.
LLM_EMBEDDING_FEATURES: dict[str, str] = {
    "llm_emb_cos_mean": "cosine of the item's LLM embedding with the normalised mean embedding of the last last_n "
                        "history items",
    "llm_emb_cos_max": "max over the last last_n history items of the cosine of their LLM embedding with the item's",
}


@dataclass(frozen=True)
class ItemEmbeddings:
    vectors: np.ndarray  # [n_items, dim] float32 unit rows, row i = item_idx i

    @property
    def n_items(self) -> int:
        return len(self.vectors)

    @classmethod
    def from_vectors(cls, vectors: np.ndarray, n_items: int) -> ItemEmbeddings:
        """Unit rows of ``vectors`` (``[n_items, dim]``); a ValueError naming the shape otherwise.

        >>> ItemEmbeddings.from_vectors(np.array([[3.0, 4.0], [0.0, 2.0]]), 2).vectors.tolist()
        [[0.6000000238418579, 0.800000011920929], [0.0, 1.0]]
        """
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or len(vectors) != n_items:
            raise ValueError(f"LLM item embeddings have shape {vectors.shape}, the catalog has {n_items} items")
        norm = np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return cls((vectors / norm).astype(np.float32))

    def columns(self, hist: np.ndarray, items: np.ndarray, last_n: int) -> list[np.ndarray]:
        """The ``LLM_EMBEDDING_FEATURES`` columns of ``items`` for a history ``hist`` (item_idx, oldest first).

        >>> e = ItemEmbeddings.from_vectors(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), 3)
        >>> [np.round(c.astype(float), 3).tolist() for c in e.columns(np.array([0, 1]), np.array([2, 0]), 5)]
        [[1.0, 0.707], [0.707, 1.0]]
        """
        recent = np.asarray(hist, dtype=np.int64)[-last_n:]
        n = len(items)
        if len(recent) == 0 or n == 0:
            return [np.full(n, np.nan, np.float32)] * len(LLM_EMBEDDING_FEATURES)
        cand, mine = self.vectors[items], self.vectors[recent]
        mean = mine.mean(axis=0)
        norm = float(np.linalg.norm(mean))
        cos_mean = cand @ (mean / norm) if norm > 1e-6 else np.full(n, np.nan, np.float32)
        return [cos_mean.astype(np.float32), (cand @ mine.T).max(axis=1)]

    # -- persistence (inside FeatureBuilder's features.npz) ------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        return {PREFIX + "vectors": self.vectors}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], n_items: int) -> ItemEmbeddings:
        if PREFIX + "vectors" not in arrays:
            raise ValueError(f"fitted feature builder lacks the array {PREFIX}vectors (coarse.llm_embedding_features)")
        vectors = np.asarray(arrays[PREFIX + "vectors"], dtype=np.float32)  # saved unit rows, kept bit for bit
        if vectors.ndim != 2 or len(vectors) != n_items:
            raise ValueError(f"saved LLM item embeddings have shape {vectors.shape}, the catalog has {n_items} items")
        return cls(vectors)


def check_embeddings(config: CoarseConfig, embeddings: ItemEmbeddings | None, n_items: int) -> ItemEmbeddings | None:
    """``embeddings`` if they fit ``config`` and a catalog of ``n_items``; a ValueError naming the mismatch.

    A feature builder's columns follow a resolved setting: ``auto`` builds none, and embeddings
    given with it are refused (``coarse_rank.train.fit_coarse`` decides ``auto`` on valid and fits
    its builders with true or false)."""
    if embeddings is not None and embeddings.n_items != n_items:
        raise ValueError(f"LLM item embeddings cover {embeddings.n_items} items, the catalog has {n_items}")
    if config.llm_embedding_features == "auto":
        if embeddings is not None:
            raise ValueError("LLM item embeddings given to a feature builder with coarse.llm_embedding_features "
                             "'auto': fit it with true or false (coarse_rank.train.fit_coarse chooses)")
        return None
    if not config.llm_embedding_features:
        if embeddings is not None:
            raise ValueError("LLM item embeddings given but coarse.llm_embedding_features is false: enable it or "
                             "drop them")
        return None
    if embeddings is None:
        raise ValueError("coarse.llm_embedding_features is true but no LLM item embeddings were given: train with "
                         "jobs.train (it reads <artifact_dir>/tags/hidden.npy, written by `recsys tag --method embed`)")
    return embeddings
