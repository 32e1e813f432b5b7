"""Column groups of the coarse features that need no fitted matrix product: the recall order,
category affinity, the user's attributes and segment lifts, and the item-tag columns.

Each function returns a list of ``[n_candidates]`` float arrays, NaN where a value is unknown;
``coarse_rank.features.FeatureBuilder.transform`` stacks them in ``FEATURES`` order.

Deliberately left out: the follow counts (``coarse_rank.features``, whose sparse block lookup
the served-rankings test compares with scipy's), the channel features
(``coarse_rank.channel_features``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from coarse_rank import statistics as st
from coarse_rank.feature_tables import FeatureTables, Vocabularies
from coarse_rank.item_tags import ItemTags
from coarse_rank.new_items import recall_order_positions
from recsys.contract import Request


def recall_columns(recall: np.ndarray) -> list[np.ndarray]:
    """The recall score, its 0-based rank (NaN last) and its gap to the request's best.

    >>> [c.tolist() for c in recall_columns(np.array([0.5, np.nan, 1.0], np.float32))]
    [[0.5, nan, 1.0], [1.0, 2.0, 0.0], [-0.5, nan, 0.0]]
    """
    rank = recall_order_positions(recall).astype(np.float32)
    best = float(np.max(recall[~np.isnan(recall)])) if (~np.isnan(recall)).any() else np.nan
    return [recall, rank, recall - np.float32(best)]


def category_affinity(item_cat: np.ndarray, hist: np.ndarray, items: np.ndarray) -> list[np.ndarray]:
    """Share of the history in each of the candidate's categories: max and mean over them."""
    n = len(items)
    n_cat = item_cat[items].sum(axis=1)
    if item_cat.shape[1] == 0 or n == 0:
        return [np.full(n, np.nan, np.float32)] * 2
    share = item_cat[hist].mean(axis=0) if len(hist) else np.zeros(item_cat.shape[1], np.float32)
    weighted = item_cat[items] * share[None, :]
    has = n_cat > 0
    return [np.where(has, weighted.max(axis=1), np.nan),
            np.where(has, weighted.sum(axis=1) / np.maximum(n_cat, 1), np.nan)]


def user_columns(tables: FeatureTables, vocab: Vocabularies, request: Request, items: np.ndarray
                 ) -> list[np.ndarray]:
    """The user's age, gender and occupation codes, and each segment's lift of the candidates."""
    n, attrs = len(items), request.user_attrs
    age = _scalar(attrs.get("age"))
    gender = _code(attrs.get("gender"), vocab.genders)
    occupation = _code(attrs.get("occupation"), vocab.occupations)
    bucket = int(st.age_bucket(np.array([age]))[0])
    nan = np.full(n, np.nan, np.float32)
    return [
        np.full(n, age, np.float32),
        np.full(n, np.nan if gender < 0 else gender, np.float32),
        np.full(n, np.nan if occupation < 0 else occupation, np.float32),
        tables.age_lift[bucket, items] if bucket >= 0 else nan,
        tables.gender_lift[gender, items] if gender >= 0 else nan,
        tables.occupation_lift[occupation, items] if occupation >= 0 else nan,
    ]


def tag_columns(tags: ItemTags, hist: np.ndarray, items: np.ndarray, last_n: int) -> list[np.ndarray]:
    """The ``TAG_FEATURES`` columns: genre and theme affinity, risk, embedding cosines."""
    n = len(items)
    known_hist = hist[tags.known[hist]]
    nan = np.full(n, np.nan, np.float32)
    if len(known_hist):  # fallback candidates have no genre/theme: category_affinity gives NaN
        affinity = [*category_affinity(tags.genres, known_hist, items),
                    *category_affinity(tags.themes, known_hist, items)]
        risk_excess = tags.n_risk[items] - np.float32(tags.n_risk[known_hist].mean())
    else:
        affinity, risk_excess = [nan] * 4, nan
    if len(hist) and n:
        emb, cand = tags.embeddings, tags.embeddings[items]
        recent = emb[hist[-last_n:]].mean(axis=0)
        norm = float(np.linalg.norm(recent))
        cos_recent = cand @ (recent / norm) if norm > 1e-6 else nan
        cosines = [cand @ emb[hist[-1]], cos_recent]
    else:
        cosines = [nan, nan]
    return [*affinity, tags.n_risk[items], risk_excess, *cosines]


def _scalar(value: object) -> float:
    try:
        return float(value) if value is not None and not pd.isna(value) else np.nan  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return np.nan


def _code(value: object, vocab: list[str]) -> int:
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return -1
    try:
        return vocab.index(str(value))
    except ValueError:
        return -1
