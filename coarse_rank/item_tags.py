"""Item-level LLM tag tables the coarse ranker's tag features look up (``CoarseConfig.tag_features``).

``ItemTags`` is the typed hand-off from the tagging job (``jobs.tagging``) to
``coarse_rank.features.FeatureBuilder``: per item (row i = item_idx i) a 0/1 matrix of its LLM
genres and themes, its number of risk flags, whether its tags are known, and a unit LLM
embedding. A fallback record (generation failed) is *unknown*: its genre/theme rows are zero,
``known`` is False and ``n_risk`` NaN, so its features read NaN, never "no genre".

The fitted builder saves these arrays beside its own tables (``arrays`` / ``from_arrays``), so
serving never reads ``<artifact_dir>/tags/``.

Deliberately left out: where the embeddings come from (``jobs.coarse_tags`` trains a
leak-free projection for them) and the features themselves (``coarse_rank.features``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from coarse_rank import statistics as st

PREFIX = "tag_"  # key prefix of the arrays inside features.npz
_ARRAYS = ("genres", "themes", "n_risk", "known", "embeddings")


@dataclass(frozen=True)
class ItemTags:
    genres: np.ndarray  # [n_items, n_genres] float32 0/1 (zero rows for unknown items)
    themes: np.ndarray  # [n_items, n_themes] float32 0/1
    n_risk: np.ndarray  # [n_items] float32 number of risk flags, NaN unknown
    known: np.ndarray  # [n_items] bool: False for a fallback record
    embeddings: np.ndarray  # [n_items, dim] float32 unit rows
    genre_names: tuple[str, ...] = ()
    theme_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.known)
        sizes = {name: len(getattr(self, name)) for name in _ARRAYS}
        if any(v != n for v in sizes.values()):
            raise ValueError(f"ItemTags arrays disagree on the number of items: {sizes}")

    @property
    def n_items(self) -> int:
        return len(self.known)

    @classmethod
    def from_tags(cls, tags: pd.DataFrame, embeddings: np.ndarray, n_items: int) -> ItemTags:
        """Tables from the tagging job's ``tags.parquet`` frame and an ``[n_items, dim]`` embedding.

        >>> frame = pd.DataFrame({"item_idx": [0, 1], "fallback": [False, True], "genres": [["Drama"], []],
        ...                       "themes": [["sad"], []], "risk_flags": [["violence"], []]})
        >>> t = ItemTags.from_tags(frame, np.eye(2, dtype=np.float32), 2)
        >>> t.genre_names, t.known.tolist(), t.n_risk.tolist()
        (('Drama',), [True, False], [1.0, nan])
        """
        if len(tags) != n_items or tags["item_idx"].tolist() != list(range(len(tags))):
            raise ValueError(f"tags cover {len(tags)} items (item_idx 0..n-1 in order required), the catalog "
                             f"has {n_items}: tag the whole catalog (`recsys tag`)")
        if embeddings.ndim != 2 or len(embeddings) != n_items:
            raise ValueError(f"embeddings have shape {embeddings.shape}, the catalog has {n_items} items")
        known = ~tags["fallback"].astype(bool).to_numpy()
        genre_names, genres = st.category_matrix(pd.Series(_lists(tags["genres"], known), dtype=object))
        theme_names, themes = st.category_matrix(pd.Series(_lists(tags["themes"], known), dtype=object))
        n_risk = np.array([len(r) for r in _lists(tags["risk_flags"], known)], dtype=np.float32)
        n_risk[~known] = np.nan
        norm = np.maximum(np.linalg.norm(embeddings, axis=1, keepdims=True), 1e-12)
        return cls(genres, themes, n_risk, known, (embeddings / norm).astype(np.float32),
                   tuple(genre_names), tuple(theme_names))

    # -- persistence (inside FeatureBuilder's features.npz / features.json) -------------
    def arrays(self) -> dict[str, np.ndarray]:
        return {PREFIX + name: getattr(self, name) for name in _ARRAYS}

    def vocabularies(self) -> dict[str, list[str]]:
        return {"genre_names": list(self.genre_names), "theme_names": list(self.theme_names)}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], vocabularies: Mapping[str, Any]) -> ItemTags:
        missing = [PREFIX + n for n in _ARRAYS if PREFIX + n not in arrays]
        if missing:
            raise ValueError(f"fitted feature builder lacks the tag arrays {missing}")
        return cls(**{n: arrays[PREFIX + n] for n in _ARRAYS},
                   genre_names=tuple(vocabularies.get("genre_names", ())),
                   theme_names=tuple(vocabularies.get("theme_names", ())))


def _lists(column: pd.Series, known: np.ndarray) -> list[list[str]]:
    """Per item its list of values (parquet gives arrays or None); empty for an unknown item."""
    return [[str(v) for v in values] if ok and values is not None else []
            for values, ok in zip(column, known, strict=True)]
