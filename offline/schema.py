"""The canonical data schema every loader produces and every stage consumes.

Three tables, stored as Parquet (``Dataset.save`` / ``Dataset.load``):

- interactions: ``user_id`` (str), ``item_id`` (str), ``rating`` (float32; 1.0 for implicit
  events), ``timestamp`` (int64 unix seconds).
- items: ``item_id`` (str), ``title`` (str), ``text`` (str, a short description; may be ""),
  ``categories`` (list[str]), ``audience`` (str or None: one of ``AUDIENCES``),
  ``risk_level`` (Int64 0..3 or <NA>), ``year`` (Int64 or <NA>), ``attributes`` (JSON str of
  anything else).
- users: ``user_id`` (str), ``age`` (Int64 or <NA>), ``gender`` (str or None),
  ``occupation`` (str or None), ``zip`` (str or None), ``risk_tolerance`` (Int64 0..3 or
  <NA>), ``attributes`` (JSON str).

External ids are strings everywhere; models use contiguous indices from ``Vocab``
(``item_idx`` = row of ``Dataset.items`` after ``encode``).

Deliberately left out: splitting and filtering (``offline.protocol``), file formats
(``offline.loaders``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from recsys.atomic import atomic_write, atomic_write_json
from recsys.names import canonical

AUDIENCES = ("all", "teen", "adult")  # audience rating, ordered from least to most restricted
RISK_LEVELS = (0, 1, 2, 3)  # 0 = none ... 3 = high

INTERACTION_COLUMNS = ("user_id", "item_id", "rating", "timestamp")
ITEM_COLUMNS = ("item_id", "title", "text", "categories", "audience", "risk_level", "year", "attributes")
USER_COLUMNS = ("user_id", "age", "gender", "occupation", "zip", "risk_tolerance", "attributes")
USER_ATTRIBUTE_COLUMNS = ("age", "gender", "occupation", "zip", "risk_tolerance")  # what a request carries


def user_attributes(users: pd.DataFrame) -> list[dict[str, Any]]:
    """Per users-table row, the attributes a ``Request`` carries (``USER_ATTRIBUTE_COLUMNS``): the
    set ones only, as plain Python values. The one place user attributes are assembled
    (``Split.user_attrs`` for training and eval, ``serving.catalog_state`` for serving).

    >>> user_attributes(pd.DataFrame({"age": pd.array([30, None], dtype="Int64"), "zip": ["1", None]}))
    [{'age': 30, 'zip': '1'}, {}]
    """
    cols = [c for c in USER_ATTRIBUTE_COLUMNS if c in users.columns]
    out: list[dict[str, Any]] = []
    for row in users[cols].itertuples(index=False):
        attrs: dict[str, Any] = {}
        for col, value in zip(cols, row, strict=True):
            if pd.isna(value):
                continue
            attrs[col] = value.item() if isinstance(value, np.generic) else value
        out.append(attrs)
    return out


class DataError(ValueError):
    """A data file is missing or malformed; the message names the file (and line when known)."""


def normalise_interactions(df: pd.DataFrame) -> pd.DataFrame:
    """Cast to canonical dtypes and column order (raises DataError on missing columns)."""
    _require(df, INTERACTION_COLUMNS, "interactions")
    out = pd.DataFrame(
        {
            "user_id": df["user_id"].astype(str),
            "item_id": df["item_id"].astype(str),
            "rating": pd.to_numeric(df["rating"], errors="raise").astype(np.float32),
            "timestamp": pd.to_numeric(df["timestamp"], errors="raise").astype(np.int64),
        }
    )
    return out.reset_index(drop=True)


def normalise_items(df: pd.DataFrame) -> pd.DataFrame:
    """Fill optional item columns with canonical empties and cast dtypes."""
    if "item_id" not in df.columns:
        raise DataError("items: missing column 'item_id'")
    n = len(df)
    out = pd.DataFrame({"item_id": df["item_id"].astype(str)})
    out["title"] = df["title"].fillna("").astype(str) if "title" in df else out["item_id"]
    out["text"] = df["text"].fillna("").astype(str) if "text" in df else ""
    if "categories" in df:
        # one spelling (NFC, recsys.names), as ids: rules and category features match names exactly
        out["categories"] = [[canonical(str(x)) for x in c] if c is not None and not _isna(c) else []
                             for c in df["categories"]]
    else:
        out["categories"] = [[] for _ in range(n)]
    out["audience"] = _opt_str(df, "audience", n)
    bad = set(out["audience"].dropna()) - set(AUDIENCES)
    if bad:
        raise DataError(f"items: audience values {sorted(bad)} not in {AUDIENCES}")
    out["risk_level"] = _opt_int(df, "risk_level", n)
    out["year"] = _opt_int(df, "year", n)
    out["attributes"] = df["attributes"].fillna("{}").astype(str) if "attributes" in df else "{}"
    if out["item_id"].duplicated().any():
        dup = out.loc[out["item_id"].duplicated(), "item_id"].iloc[0]
        raise DataError(f"items: duplicate item_id {dup!r}")
    return out.reset_index(drop=True)


def normalise_users(df: pd.DataFrame) -> pd.DataFrame:
    if "user_id" not in df.columns:
        raise DataError("users: missing column 'user_id'")
    n = len(df)
    out = pd.DataFrame({"user_id": df["user_id"].astype(str)})
    out["age"] = _opt_int(df, "age", n)
    for col in ("gender", "occupation", "zip"):
        out[col] = _opt_str(df, col, n)
    out["risk_tolerance"] = _opt_int(df, "risk_tolerance", n)
    out["attributes"] = df["attributes"].fillna("{}").astype(str) if "attributes" in df else "{}"
    return out.reset_index(drop=True)


@dataclass
class Dataset:
    """A loaded dataset in the canonical schema (see module docstring)."""

    name: str
    interactions: pd.DataFrame
    items: pd.DataFrame
    users: pd.DataFrame

    def __post_init__(self) -> None:
        self.interactions = normalise_interactions(self.interactions)
        self.items = normalise_items(self.items)
        self.users = normalise_users(self.users)

    def save(self, directory: Path) -> None:
        """Write ``interactions/items/users.parquet`` + ``meta.json`` atomically (tmp + rename)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for table in ("interactions", "items", "users"):
            atomic_write(directory / f"{table}.parquet", partial(getattr(self, table).to_parquet, index=False))
        meta = {"name": self.name, "n_interactions": len(self.interactions),
                "n_items": len(self.items), "n_users": len(self.users)}
        atomic_write_json(directory / "meta.json", meta)

    @classmethod
    def load(cls, directory: Path) -> Dataset:
        directory = Path(directory)
        meta_path = directory / "meta.json"
        if not meta_path.exists():
            raise DataError(f"{meta_path}: not found (run `recsys prepare` first)")
        meta = json.loads(meta_path.read_text())
        tables = {}
        for table in ("interactions", "items", "users"):
            path = directory / f"{table}.parquet"
            if not path.exists():
                raise DataError(f"{path}: not found")
            tables[table] = pd.read_parquet(path)
        return cls(name=meta["name"], **tables)


@dataclass(frozen=True)
class Vocab:
    """External id <-> contiguous index maps for users and items.

    ``item_ids[i]`` is the external id of item index ``i``; ``item_index[id]`` the reverse.
    Built from the items table order (so item_idx == row of the encoded items table).
    """

    user_ids: np.ndarray
    item_ids: np.ndarray

    @classmethod
    def build(cls, users: pd.Series, items: pd.Series) -> Vocab:
        return cls(user_ids=np.asarray(users, dtype=object), item_ids=np.asarray(items, dtype=object))

    @property
    def n_users(self) -> int:
        return len(self.user_ids)

    @property
    def n_items(self) -> int:
        return len(self.item_ids)

    @property
    def user_index(self) -> dict[str, int]:
        return {u: i for i, u in enumerate(self.user_ids)}

    @property
    def item_index(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.item_ids)}


def _require(df: pd.DataFrame, cols: tuple[str, ...], table: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise DataError(f"{table}: missing column(s) {missing}")


def _isna(v: object) -> bool:
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def _opt_str(df: pd.DataFrame, col: str, n: int) -> pd.Series:
    if col not in df:
        return pd.Series([None] * n, dtype=object)
    return df[col].astype(object).where(df[col].notna(), None).reset_index(drop=True)


def _opt_int(df: pd.DataFrame, col: str, n: int) -> pd.Series:
    if col not in df:
        return pd.Series([pd.NA] * n, dtype="Int64")
    return pd.to_numeric(df[col], errors="coerce").astype("Int64").reset_index(drop=True)
