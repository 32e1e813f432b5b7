"""The LLM-embedding recall channel, and a recall stage that merges it with two-tower + popularity.

``LLMEmbeddingChannel`` searches the faiss index over the tagging job's 256-d item embeddings
(``<artifact_dir>/tags/embed``, see ``jobs.tagging.embed``; ``recsys tag --method embed`` makes them
without generating tags, ``jobs.tagging.hidden_states``) with the mean of the user's
last ``window`` history items' embeddings (item-to-item similarity, as in item-based
collaborative filtering; the projection was trained on co-interacted items, so the mean points
at what tends to come next). Cold users (no history) get nothing from it.

``LLMChannelRecallStage`` (stage kind ``recall_llm``) is ``recall.stage.RecallStage`` plus this
channel: ``params.llm_share`` of the depth (default 0.2) is dealt to it through
``recall.channels.merge_channels``; ``llm_window`` sets the history window. With
``llm_share: 0`` it returns exactly what ``RecallStage`` returns.

The embeddings are stored by position (row i = item_idx i of the catalog they were made for),
and a split prepared again may order or choose its items differently. So ``load`` refuses
embeddings whose ``embed/meta.json`` names another catalog than the split's item ids
(``catalog_digest``, the digest the tagging job records in its version, ``tags_version.catalog``
there) or whose row count is not the split's: no item is ever ranked by another's vector.

Deliberately left out: training the embeddings (``jobs.tagging.embed``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from offline.split import Phase, Split
from offline.tag_store import catalog_digest, load_embeddings
from recall.channels import merge_channels
from recall.config import RecallConfig
from recall.index import ItemIndex
from recall.stage import RecallStage
from recsys.config import StageSpec
from recsys.contract import Candidates, Request

LLM_CHANNEL = "llm_embed"
REMEDY = ("re-run `recsys tag --method embed --fresh` (or `recsys tag --fresh` then `recsys tag embed-train`) "
          "for this split")


def require_split_embeddings(embed_dir: Path, n_vectors: int, item_ids: Sequence[object]) -> None:
    """Raise ValueError naming the file unless the ``n_vectors`` embeddings in ``embed_dir`` were made
    for exactly the split's ``item_ids`` (their ``meta.json`` catalog digest, and one row per item)."""
    embed_dir = Path(embed_dir)
    if n_vectors != len(item_ids):
        raise ValueError(f"{embed_dir / 'embeddings.npy'}: {n_vectors} item embeddings but the split has "
                         f"{len(item_ids)} items: they were made for another catalog (the split was prepared "
                         f"again); {REMEDY}")
    meta_path = embed_dir / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    made_for = (meta.get("tags_version") or {}).get("catalog")
    if made_for is None:
        raise ValueError(f"{meta_path}: does not say which catalog the embeddings were made for (missing, or "
                         f"written before the tags recorded it); {REMEDY}")
    if made_for != catalog_digest(item_ids):
        raise ValueError(f"{meta_path}: the embeddings were made for another catalog (item ids {made_for}) than "
                         f"the split's ({catalog_digest(item_ids)}): the split was prepared again; {REMEDY}")


class LLMEmbeddingChannel:
    name = LLM_CHANNEL

    def __init__(self, vectors: np.ndarray, index: Any, window: int = 20) -> None:
        if window < 1:
            raise ValueError(f"llm channel window must be >= 1, got {window}")
        self.vectors, self.index, self.window = vectors, index, window

    @classmethod
    def load(cls, artifact_dir: Path, item_ids: Sequence[object], window: int = 20) -> LLMEmbeddingChannel:
        """The embeddings under ``<artifact_dir>/tags/embed``, checked to be those of the catalog
        ``item_ids`` (the split's, in item_idx order; ``require_split_embeddings``)."""
        tags = Path(artifact_dir) / "tags"
        vectors = load_embeddings(tags)
        require_split_embeddings(tags / "embed", len(vectors), item_ids)
        index = ItemIndex.load(tags / "embed" / "index")
        if index.ntotal != len(vectors):
            raise ValueError(f"{tags / 'embed' / 'index'}: holds {index.ntotal} items, embeddings.npy {len(vectors)}: "
                             "re-run `recsys tag embed-train`")
        return cls(vectors, index, window)

    def candidates(self, history: np.ndarray, exclude: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``n`` (ids, cosine scores) nearest to the recent-history centroid, ``exclude`` removed."""
        h = np.asarray(history, dtype=np.int64)
        h = h[(h >= 0) & (h < len(self.vectors))][-self.window:]
        if len(h) == 0 or n <= 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        query = self.vectors[h].mean(0, keepdims=True)
        query /= max(float(np.linalg.norm(query)), 1e-12)
        scores, ids = self.index.search(query.astype(np.float32), min(n + len(exclude), len(self.vectors)))
        keep = (ids[0] >= 0) & ~np.isin(ids[0], exclude)
        return ids[0][keep][:n], scores[0][keep][:n]


class LLMChannelRecallStage(RecallStage):
    """``RecallStage`` with the LLM-embedding channel merged in (stage kind ``recall_llm``)."""

    def __init__(self, spec: StageSpec, config: RecallConfig) -> None:
        params = dict(spec.params)  # its keys: recall.config.LLM_CHANNEL_PARAMS
        self.llm_share = float(params.pop("llm_share", 0.2))
        self.llm_window = int(params.pop("llm_window", 20))
        if not 0.0 <= self.llm_share <= 1.0:
            raise ValueError(f"stage {spec.name!r}: params.llm_share must be in [0, 1], got {self.llm_share}")
        super().__init__(spec.model_copy(update={"params": params}), config)
        self._llm: LLMEmbeddingChannel | None = None

    def load(self, artifact_dir: Any, subdir: str = "recall", phase: Phase = "test") -> None:
        super().load(artifact_dir, subdir, phase)
        items = Split.load(Path(artifact_dir) / "split").items["item_id"]
        self._llm = LLMEmbeddingChannel.load(Path(artifact_dir), items.tolist(), self.llm_window)

    def version(self) -> str:
        return f"{super().version()}+llm{self.llm_share:g}"

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        base = super().run(request, candidates)
        if self._llm is None or self.llm_share == 0.0:
            return base
        history = self.model.known(request.history)
        exclude = np.unique(request.excluded)
        n_llm = int(round(self.depth * self.llm_share)) if len(history) else 0
        llm_ids, llm_scores = self._llm.candidates(history, exclude, n_llm)
        # Re-deal: the base merge's order (two-tower + popularity, by their quotas) keeps
        # depth - n_llm slots, the LLM channel gets n_llm.
        merged = merge_channels(
            [("base", base.items, base.scores["recall"]), (LLM_CHANNEL, llm_ids, llm_scores)],
            self.depth, exclude, quotas={"base": self.depth - n_llm, LLM_CHANNEL: n_llm},
        )
        return _carry_base_columns(merged, base)


def _carry_base_columns(merged: Candidates, base: Candidates) -> Candidates:
    """Keep the base merge's per-channel columns (src_two_tower, recall_popularity, ...)."""
    pos = {int(item): i for i, item in enumerate(base.items)}
    rows = np.array([pos.get(int(item), -1) for item in merged.items], dtype=np.int64)
    found = rows >= 0
    for name, col in base.scores.items():
        if name != "recall":
            out = np.full(len(rows), np.nan, dtype=np.float32)
            out[found] = col[rows[found]]
            merged.scores[name] = out
    for name, flag in base.flags.items():
        merged.flags[name] = np.where(found, flag[np.maximum(rows, 0)], False)
    merged.scores.pop("recall_base", None)
    merged.flags.pop("src_base", None)
    return merged
