"""Side features of the two towers, encoded to small integer / multi-hot arrays.

Item side (``ItemFeatures``, training only: serving reads the saved item vectors): multi-hot
categories, audience (``offline.schema.AUDIENCES``) and a decade bucket of the release year,
plus optional text embeddings (``recall.text``). User side (``UserVocab``, training and
serving): age bucket, gender and occupation. Index 0 of every categorical is the learned
"unknown" slot, so missing, NaN and never-seen values all map there and a cold user with no
attributes still gets a vector.

Deliberately left out: zip codes (too sparse at this scale), risk levels (the compliance
rules handle those) and free-form ``attributes`` JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from offline.schema import AUDIENCES

# MovieLens-1M age groups (<18, 18-24, 25-34, 35-44, 45-49, 50-55, 56+); bucket 0 = unknown.
AGE_EDGES = (18, 25, 35, 45, 50, 56)
N_AGE_BUCKETS = len(AGE_EDGES) + 2
# Release decades 1920s..2020s; earlier years share bucket 1, later ones the last; 0 = unknown.
YEAR_FIRST_DECADE, N_DECADES = 1920, 11
N_YEAR_BUCKETS = N_DECADES + 1
N_AUDIENCE = len(AUDIENCES) + 1


def _missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def age_bucket(age: Any) -> int:
    """0 for unknown, else 1 + number of ``AGE_EDGES`` at or below ``age``.

    >>> [age_bucket(a) for a in (None, 7, 18, 30, 70)]
    [0, 1, 2, 3, 7]
    """
    if _missing(age):
        return 0
    return 1 + int(np.searchsorted(AGE_EDGES, float(age), side="right"))


def year_bucket(year: Any) -> int:
    """0 for unknown, else the clipped decade index from 1 (1920s and before).

    >>> [year_bucket(y) for y in (None, 1900, 1995, 2031)]
    [0, 1, 8, 11]
    """
    if _missing(year):
        return 0
    decade = (int(year) - YEAR_FIRST_DECADE) // 10
    return 1 + int(np.clip(decade, 0, N_DECADES - 1))


@dataclass(frozen=True)
class ItemFeatures:
    """Per-item side features; row i describes item_idx i."""

    categories: np.ndarray  # [n_items, n_categories] float32 multi-hot
    category_names: tuple[str, ...]
    audience: np.ndarray  # [n_items] int64, 0 = unknown
    year: np.ndarray  # [n_items] int64 decade bucket, 0 = unknown
    text: np.ndarray | None = None  # [n_items, text_dim] float32, or None

    @property
    def n_items(self) -> int:
        return len(self.audience)

    @classmethod
    def from_items(cls, items: pd.DataFrame, text: np.ndarray | None = None) -> ItemFeatures:
        """Encode a canonical items table (``Split.items``); ``text`` rows must align with it."""
        n = len(items)
        if text is not None and text.shape[0] != n:
            raise ValueError(f"text embeddings have {text.shape[0]} rows, the items table has {n}")
        cats = [list(c) for c in items["categories"]]
        names = tuple(sorted({c for row in cats for c in row}))
        col = {c: j for j, c in enumerate(names)}
        multi_hot = np.zeros((n, len(names)), dtype=np.float32)
        for i, row in enumerate(cats):
            multi_hot[i, [col[c] for c in row]] = 1.0
        aud_index = {a: j + 1 for j, a in enumerate(AUDIENCES)}
        audience = np.array([aud_index.get(a, 0) if not _missing(a) else 0 for a in items["audience"]], np.int64)
        year = np.array([year_bucket(y) for y in items["year"]], dtype=np.int64)
        return cls(multi_hot, names, audience, year, None if text is None else text.astype(np.float32))


@dataclass(frozen=True)
class UserVocab:
    """Gender and occupation vocabularies (index 0 = unknown) learned from the users table."""

    genders: tuple[str, ...]
    occupations: tuple[str, ...]

    @classmethod
    def from_users(cls, users: pd.DataFrame) -> UserVocab:
        def values(col: str) -> tuple[str, ...]:
            if col not in users:
                return ()
            return tuple(sorted({str(v) for v in users[col] if not _missing(v)}))

        return cls(genders=values("gender"), occupations=values("occupation"))

    @property
    def sizes(self) -> tuple[int, int, int]:
        """Embedding table sizes (age, gender, occupation), unknown slots included."""
        return N_AGE_BUCKETS, len(self.genders) + 1, len(self.occupations) + 1

    def encode(self, attrs: Mapping[str, Any]) -> np.ndarray:
        """``[age_bucket, gender, occupation]`` int64 for one user's attributes.

        >>> UserVocab(("F", "M"), ("writer",)).encode({"age": 30, "gender": "M", "occupation": "pilot"}).tolist()
        [3, 2, 0]
        """
        gender, occupation = attrs.get("gender"), attrs.get("occupation")
        g = 0 if _missing(gender) or str(gender) not in self.genders else 1 + self.genders.index(str(gender))
        o = 0
        if not _missing(occupation) and str(occupation) in self.occupations:
            o = 1 + self.occupations.index(str(occupation))
        return np.array([age_bucket(attrs.get("age")), g, o], dtype=np.int64)

    def encode_table(self, users: pd.DataFrame) -> np.ndarray:
        """``[n_users, 3]`` codes for every row of a users table (row u == user_idx u)."""
        cols = [c for c in ("age", "gender", "occupation") if c in users]
        records = users[cols].to_dict("records")
        return np.stack([self.encode(r) for r in records]) if records else np.zeros((0, 3), np.int64)

    def to_json(self) -> dict[str, list[str]]:
        return {"genders": list(self.genders), "occupations": list(self.occupations)}

    @classmethod
    def from_json(cls, data: Mapping[str, list[str]]) -> UserVocab:
        return cls(genders=tuple(data["genders"]), occupations=tuple(data["occupations"]))
