"""The coarse ranker's fitted lookup tables: per-item statistics, the follow matrix, segment lifts.

``FeatureTables.fit`` computes them from training interactions only (``coarse_rank.statistics``
does the arithmetic); every array is indexed by item_idx (lifts: ``[segment, item_idx]``).
``Vocabularies`` holds the category, gender and occupation codes the tables were fitted with.
``arrays``/``from_arrays`` are the tables' part of ``features.npz`` (``coarse_rank.feature_store``).

Deliberately left out: turning the tables into one request's columns (``coarse_rank.features``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import pandas as pd
from scipy import sparse

from coarse_rank import statistics as st
from coarse_rank.config import CoarseConfig
from offline.schema import AUDIENCES
from offline.split import Split


@dataclass(frozen=True)
class Vocabularies:
    """The attribute codes of a fitted builder (saved in ``features.json``)."""

    categories: list[str]
    genders: list[str]
    occupations: list[str]


@dataclass
class FeatureTables:
    """Fitted lookups; every array is indexed by item_idx (lifts: [segment, item_idx])."""

    log_pop: np.ndarray
    recent_pop: np.ndarray
    year: np.ndarray
    audience: np.ndarray
    mean_rating: np.ndarray
    item_cat: np.ndarray  # [n_items, n_categories] 0/1
    follow: sparse.csr_matrix  # follow[a, b]: b came after a
    age_lift: np.ndarray
    gender_lift: np.ndarray
    occupation_lift: np.ndarray
    follow_t: sparse.csr_matrix = field(init=False)  # follow transposed: row b lists what b followed
    follow_out: np.ndarray = field(init=False)  # row sums of follow

    def __post_init__(self) -> None:
        self.follow_t = self.follow.T.tocsr()
        self.follow_out = np.asarray(self.follow.sum(axis=1)).ravel()

    @classmethod
    def fit(cls, split: Split, df: pd.DataFrame, config: CoarseConfig) -> tuple[FeatureTables, Vocabularies]:
        """The tables from the interactions ``df`` (sorted by user then time) and the attribute
        tables of ``split``, and the vocabularies they were coded with."""
        n, prior = split.n_items, config.attribute_prior
        users, items = df["user_idx"].to_numpy(np.int64), df["item_idx"].to_numpy(np.int64)
        categories, item_cat = st.category_matrix(split.items["categories"])
        genders, gender = st.codes(split.users["gender"])
        occupations, occupation = st.codes(split.users["occupation"])
        age = st.age_bucket(as_float(split.users["age"]))
        _, audience = st.codes(split.items["audience"], list(AUDIENCES))
        tables = cls(
            log_pop=st.log_popularity(items, n),
            recent_pop=st.recency_popularity(
                items, df["timestamp"].to_numpy(np.int64), n, config.recency_half_life_days * 86_400.0),
            year=as_float(split.items["year"]).astype(np.float32),
            audience=np.where(audience >= 0, audience, np.nan).astype(np.float32),
            mean_rating=st.shrunk_mean_rating(items, df["rating"].to_numpy(np.float32), n, prior),
            item_cat=item_cat,
            follow=st.followed_by(users, items, n, config.cooc_window),
            age_lift=st.segment_lift(age[users], items, st.N_AGE_BUCKETS, n, prior),
            gender_lift=st.segment_lift(gender[users], items, max(len(genders), 1), n, prior),
            occupation_lift=st.segment_lift(occupation[users], items, max(len(occupations), 1), n, prior),
        )
        return tables, Vocabularies(categories, genders, occupations)

    def arrays(self) -> dict[str, Any]:
        """The arrays ``from_arrays`` reads back (the follow matrix as its three CSR parts)."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self) if f.init and f.name != "follow"}
        return {**out, "follow_data": self.follow.data, "follow_indices": self.follow.indices,
                "follow_indptr": self.follow.indptr}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> FeatureTables:
        """The tables from ``arrays`` (popped: what remains belongs to other feature groups)."""
        n = len(arrays["log_pop"])
        follow = sparse.csr_matrix(
            (arrays.pop("follow_data"), arrays.pop("follow_indices"), arrays.pop("follow_indptr")), shape=(n, n))
        names = [f.name for f in fields(cls) if f.init and f.name != "follow"]
        return cls(follow=follow, **{name: arrays.pop(name) for name in names})


def as_float(col: pd.Series) -> np.ndarray:
    """A column as float64, NaN where it is missing or not a number."""
    return pd.to_numeric(col, errors="coerce").astype("Float64").to_numpy(dtype=np.float64, na_value=np.nan)
