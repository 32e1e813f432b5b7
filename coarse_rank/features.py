"""Coarse-ranker features: (request, candidates) -> float32 matrix [n_candidates, n_features].

``FeatureBuilder.fit`` computes lookup tables from training interactions only (see
``coarse_rank.statistics``); ``transform`` then builds one request's matrix with array
lookups, no per-candidate Python loop. NaN marks a missing value (LightGBM routes it).
Feature names are stable for a fitted builder: the ``FEATURES`` (``coarse_rank.feature_names``), the ``TAG_FEATURES``
when ``CoarseConfig.tag_features`` is on (looked up in ``coarse_rank.item_tags.ItemTags``,
saved with the builder), the ``coarse_rank.channel_features`` columns when
``CoarseConfig.channel_features`` is on (the default), then the recall channel columns seen at fit time
(``recall_<channel>`` scores, ``src_<channel>`` flags as 0/1); a channel absent from a
request reads NaN, an unknown one is ignored.

Deliberately left out: candidate generation and labels (``coarse_rank.dataset``), the model
(``coarse_rank.train``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import sparse

from coarse_rank import statistics as st
from coarse_rank.channel_features import CHANNEL_FEATURES, ChannelTables, rank_names
from coarse_rank.channel_features import PREFIX as CHANNEL_PREFIX
from coarse_rank.config import CoarseConfig
from coarse_rank.feature_names import FEATURES, INTERACTION_FEATURES, TAG_FEATURES
from coarse_rank.item_tags import PREFIX as TAG_PREFIX
from coarse_rank.item_tags import ItemTags
from offline.schema import AUDIENCES
from offline.split import Split
from recall.channels import TWO_TOWER
from recall.item_models import row_entries
from recsys.contract import Candidates, Request


@dataclass
class _Tables:
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


class FeatureBuilder:
    """Fitted once per training run; ``transform`` is called per request by the stage."""

    def __init__(self, config: CoarseConfig | None = None) -> None:
        self.config = config or CoarseConfig()
        self.score_columns: tuple[str, ...] = ()
        self.flag_columns: tuple[str, ...] = ()
        self.categories: list[str] = []
        self.genders: list[str] = []
        self.occupations: list[str] = []
        self._t: _Tables | None = None
        self._tags: ItemTags | None = None
        self._channels: ChannelTables | None = None

    @property
    def feature_names(self) -> list[str]:
        tag_names = TAG_FEATURES if self.config.tag_features else {}
        channel_names = [*CHANNEL_FEATURES, *rank_names(self.score_columns)] if self.config.channel_features else []
        return [*FEATURES, *tag_names, *channel_names, *self.score_columns, *self.flag_columns]

    @property
    def n_items(self) -> int:
        return len(self._tables.log_pop)

    @property
    def interaction_columns(self) -> tuple[np.ndarray, np.ndarray]:
        """(columns a new item has NaN in, flag columns it has 0 in), as positions in ``transform``'s matrix:
        ``INTERACTION_FEATURES`` and the scores, ranks and source flags of every recall channel that
        lists items from their interactions (all but the content-aware two-tower)."""
        names = self.feature_names
        channels = {c.removeprefix("recall_") for c in self.score_columns} - {TWO_TOWER}
        nan = set(INTERACTION_FEATURES) | {f"recall_{c}" for c in channels} | {f"rank_{c}" for c in channels}
        zero = {f"src_{c}" for c in channels}
        return (np.array([i for i, n in enumerate(names) if n in nan], dtype=np.int64),
                np.array([i for i, n in enumerate(names) if n in zero], dtype=np.int64))

    def hide_interactions(self, x: np.ndarray, rows: np.ndarray) -> None:
        """Make ``rows`` of a ``transform`` matrix look like new items' rows (in place)."""
        if not rows.any():  # the usual request: no new item, nothing to look up
            return
        nan, zero = self.interaction_columns
        x[np.ix_(rows, nan)] = np.nan
        x[np.ix_(rows, zero)] = 0.0

    def known_items(self) -> np.ndarray:
        """[n_items] bool: the fitted table holds at least one interaction of the item."""
        return self._tables.log_pop > 0

    def fit(
        self,
        split: Split,
        interactions: pd.DataFrame | None = None,
        *,
        score_columns: Sequence[str] = (),
        flag_columns: Sequence[str] = (),
        tags: ItemTags | None = None,
    ) -> FeatureBuilder:
        """Fit on ``interactions`` (default ``split.train``; same layout, sorted by user then time).

        Only the item/user attribute tables of ``split`` are read besides ``interactions``.
        ``tags`` (required exactly when ``config.tag_features``) is kept as given: its
        embeddings must not have been trained on what the labels of ``interactions`` hold.
        """
        cfg, n = self.config, split.n_items
        self._tags = check_tags(cfg, tags, n)
        df = split.train if interactions is None else interactions
        users, items = df["user_idx"].to_numpy(np.int64), df["item_idx"].to_numpy(np.int64)
        if len(items) and (items.min() < 0 or items.max() >= n):
            raise ValueError(f"FeatureBuilder.fit: item_idx outside [0, {n}) in interactions")
        self.score_columns, self.flag_columns = tuple(score_columns), tuple(flag_columns)
        self.categories, item_cat = st.category_matrix(split.items["categories"])
        self.genders, gender = st.codes(split.users["gender"])
        self.occupations, occupation = st.codes(split.users["occupation"])
        age = st.age_bucket(_float(split.users["age"]))
        _, audience = st.codes(split.items["audience"], list(AUDIENCES))
        prior = cfg.attribute_prior
        self._t = _Tables(
            log_pop=st.log_popularity(items, n),
            recent_pop=st.recency_popularity(
                items, df["timestamp"].to_numpy(np.int64), n, cfg.recency_half_life_days * 86_400.0),
            year=_float(split.items["year"]).astype(np.float32),
            audience=np.where(audience >= 0, audience, np.nan).astype(np.float32),
            mean_rating=st.shrunk_mean_rating(items, df["rating"].to_numpy(np.float32), n, prior),
            item_cat=item_cat,
            follow=st.followed_by(users, items, n, cfg.cooc_window),
            age_lift=st.segment_lift(age[users], items, st.N_AGE_BUCKETS, n, prior),
            gender_lift=st.segment_lift(gender[users], items, max(len(self.genders), 1), n, prior),
            occupation_lift=st.segment_lift(occupation[users], items, max(len(self.occupations), 1), n, prior),
        )
        self._channels = ChannelTables.fit(users, items, n, cfg) if cfg.channel_features else None
        return self

    def transform(self, request: Request, candidates: Candidates) -> np.ndarray:
        """The [len(candidates), n_features] float32 matrix for one request (see ``FEATURES``)."""
        t, items = self._tables, candidates.items
        if len(items) and (items.min() < 0 or items.max() >= self.n_items):
            bad = items[(items < 0) | (items >= self.n_items)][0]
            raise ValueError(f"candidate item_idx {bad} outside the fitted catalog [0, {self.n_items})")
        hist = request.history[(request.history >= 0) & (request.history < self.n_items)]
        cols = [
            *_recall_columns(candidates.score("recall")),
            t.log_pop[items], t.recent_pop[items], t.year[items], t.audience[items], t.mean_rating[items],
            t.item_cat[items].sum(axis=1),
            np.full(len(items), len(hist), dtype=np.float32),
            *_category_affinity(t.item_cat, hist, items),
            *self._follow_columns(hist, items),
            *self._user_columns(request, items),
            *(self._tag_columns(hist, items) if self.config.tag_features else []),
            *(self._channels.columns(hist, candidates, self.score_columns) if self._channels is not None else []),
            *(candidates.score(c) for c in self.score_columns),
            *(candidates.flags[f].astype(np.float32) if f in candidates.flags
              else np.full(len(items), np.nan, np.float32) for f in self.flag_columns),
        ]
        x = np.column_stack(cols).astype(np.float32, copy=False).reshape(len(items), len(self.feature_names))
        self.hide_interactions(x, t.log_pop[items] <= 0)  # a new item: what its interactions say is unknown, not zero
        return x

    def transform_many(self, requests: Sequence[Request], candidates: Sequence[Candidates]) -> np.ndarray:
        """Row-stacked ``transform`` of each (request, candidates) pair, in order."""
        if len(requests) != len(candidates):
            raise ValueError(f"transform_many: {len(requests)} requests but {len(candidates)} candidate sets")
        mats = [self.transform(r, c) for r, c in zip(requests, candidates, strict=True)]
        return np.vstack(mats) if mats else np.zeros((0, len(self.feature_names)), np.float32)

    # -- feature groups ---------------------------------------------------------------
    def _follow_columns(self, hist: np.ndarray, items: np.ndarray) -> list[np.ndarray]:
        n = len(items)
        if len(hist) == 0 or n == 0:
            return [np.full(n, np.nan, np.float32)] * 5
        last = hist[-self.config.last_n:][::-1]  # most recent first
        t = self._tables
        sub = _dense_block(t.follow, last, items)  # [len(last), n]
        out_deg = max(float(t.follow_out[last[0]]), 1.0)
        precede = _dense_block(t.follow_t, last[:1], items)[0]  # follow[item, last]
        return [sub[0], sub[0] / out_deg, sub.sum(axis=0), sub.max(axis=0), precede]

    def _tag_columns(self, hist: np.ndarray, items: np.ndarray) -> list[np.ndarray]:
        tags, n = self._item_tags, len(items)
        known_hist = hist[tags.known[hist]]
        nan = np.full(n, np.nan, np.float32)
        if len(known_hist):  # fallback candidates have no genre/theme: _category_affinity gives NaN
            affinity = [*_category_affinity(tags.genres, known_hist, items),
                        *_category_affinity(tags.themes, known_hist, items)]
            risk_excess = tags.n_risk[items] - np.float32(tags.n_risk[known_hist].mean())
        else:
            affinity, risk_excess = [nan] * 4, nan
        if len(hist) and n:
            emb, cand = tags.embeddings, tags.embeddings[items]
            recent = emb[hist[-self.config.last_n:]].mean(axis=0)
            norm = float(np.linalg.norm(recent))
            cos_recent = cand @ (recent / norm) if norm > 1e-6 else nan
            cosines = [cand @ emb[hist[-1]], cos_recent]
        else:
            cosines = [nan, nan]
        return [*affinity, tags.n_risk[items], risk_excess, *cosines]

    def _user_columns(self, request: Request, items: np.ndarray) -> list[np.ndarray]:
        t, n, attrs = self._tables, len(items), request.user_attrs
        age = _scalar(attrs.get("age"))
        gender = _code(attrs.get("gender"), self.genders)
        occupation = _code(attrs.get("occupation"), self.occupations)
        bucket = int(st.age_bucket(np.array([age]))[0])
        nan = np.full(n, np.nan, np.float32)
        return [
            np.full(n, age, np.float32),
            np.full(n, np.nan if gender < 0 else gender, np.float32),
            np.full(n, np.nan if occupation < 0 else occupation, np.float32),
            t.age_lift[bucket, items] if bucket >= 0 else nan,
            t.gender_lift[gender, items] if gender >= 0 else nan,
            t.occupation_lift[occupation, items] if occupation >= 0 else nan,
        ]

    # -- persistence ------------------------------------------------------------------
    def save(self, directory: Path) -> None:
        """Write ``features.npz`` (arrays) and ``features.json`` (names, vocabularies, config)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        t = self._tables
        arrays: dict[str, Any] = {f.name: getattr(t, f.name) for f in fields(t) if f.init and f.name != "follow"}
        arrays.update(self._tags.arrays() if self._tags is not None else {})
        arrays.update(self._channels.arrays() if self._channels is not None else {})
        np.savez(directory / "features.npz", **arrays, follow_data=t.follow.data,
                 follow_indices=t.follow.indices, follow_indptr=t.follow.indptr)
        meta = {"config": self.config.model_dump(), "feature_names": self.feature_names,
                "score_columns": list(self.score_columns), "flag_columns": list(self.flag_columns),
                "categories": self.categories, "genders": self.genders, "occupations": self.occupations,
                **({"tags": self._tags.vocabularies()} if self._tags is not None else {})}
        (directory / "features.json").write_text(json.dumps(meta, indent=2))

    @classmethod
    def load(cls, directory: Path) -> FeatureBuilder:
        directory = Path(directory)
        for name in ("features.json", "features.npz"):
            if not (directory / name).exists():
                raise FileNotFoundError(f"{directory / name}: no fitted feature builder here")
        meta = json.loads((directory / "features.json").read_text())
        fb = cls(CoarseConfig(**meta["config"]))
        fb.score_columns, fb.flag_columns = tuple(meta["score_columns"]), tuple(meta["flag_columns"])
        fb.categories, fb.genders, fb.occupations = meta["categories"], meta["genders"], meta["occupations"]
        with np.load(directory / "features.npz", allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        n = len(arrays["log_pop"])
        follow = sparse.csr_matrix(
            (arrays.pop("follow_data"), arrays.pop("follow_indices"), arrays.pop("follow_indptr")), shape=(n, n))
        tag_arrays = {k: arrays.pop(k) for k in [k for k in arrays if k.startswith(TAG_PREFIX)]}
        channel_arrays = {k: arrays.pop(k) for k in [k for k in arrays if k.startswith(CHANNEL_PREFIX)]}
        if fb.config.channel_features:
            fb._channels = ChannelTables.from_arrays(channel_arrays, n, fb.config)
        if fb.config.tag_features:
            fb._tags = check_tags(fb.config, ItemTags.from_arrays(tag_arrays, meta.get("tags", {})), n)
        fb._t = _Tables(follow=follow, **arrays)
        if fb.feature_names != meta["feature_names"]:
            raise ValueError(f"{directory / 'features.json'}: feature names differ from this code's FEATURES")
        return fb

    @property
    def _tables(self) -> _Tables:
        if self._t is None:
            raise RuntimeError("FeatureBuilder is not fitted: call fit(split) or FeatureBuilder.load(dir)")
        return self._t

    @property
    def _item_tags(self) -> ItemTags:
        if self._tags is None:
            raise RuntimeError("FeatureBuilder has no item tags: fit(..., tags=ItemTags) with tag_features on")
        return self._tags


def check_tags(config: CoarseConfig, tags: ItemTags | None, n_items: int) -> ItemTags | None:
    """``tags`` if they fit ``config`` and a catalog of ``n_items``; a ValueError naming the mismatch."""
    if not config.tag_features:
        if tags is not None:
            raise ValueError("item tags given but coarse.tag_features is false: enable it or drop the tags")
        return None
    if tags is None:
        raise ValueError("coarse.tag_features is true but no item tags were given: train this model with "
                         "jobs.coarse_tags.train_coarse_tags (it passes ItemTags to train_coarse)")
    if tags.n_items != n_items:
        raise ValueError(f"item tags cover {tags.n_items} items, the catalog has {n_items}: tag the whole catalog")
    return tags


def _recall_columns(recall: np.ndarray) -> list[np.ndarray]:
    n = len(recall)
    key = np.where(np.isnan(recall), -np.inf, recall)
    rank = np.empty(n, dtype=np.float32)
    rank[np.argsort(-key, kind="stable")] = np.arange(n, dtype=np.float32)
    best = float(np.max(recall[~np.isnan(recall)])) if (~np.isnan(recall)).any() else np.nan
    return [recall, rank, recall - np.float32(best)]


def _dense_block(mat: sparse.csr_matrix, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``mat[rows][:, cols].toarray()`` (same values, same dtype) by binary search over the rows' entries.

    >>> m = sparse.csr_matrix(np.array([[0, 5, 0], [0, 0, 0], [7, 0, 8]], np.float32))
    >>> _dense_block(m, np.array([2, 0]), np.array([2, 1, 2])).tolist()
    [[8.0, 0.0, 8.0], [0.0, 5.0, 0.0]]
    """
    n_cols = mat.shape[1]
    which, found, vals = row_entries(mat, rows)
    keys = which * n_cols + found  # ascending within a row when mat's indices are sorted; sort anyway
    order = np.argsort(keys, kind="stable")
    keys, vals = keys[order], vals[order]
    want = (np.arange(len(rows), dtype=np.int64)[:, None] * n_cols + np.asarray(cols, np.int64)[None, :]).ravel()
    out = np.zeros(len(want), dtype=mat.dtype)
    if len(keys):
        pos = np.minimum(np.searchsorted(keys, want), len(keys) - 1)
        hit = keys[pos] == want
        out[hit] = vals[pos[hit]]
    return out.reshape(len(rows), len(cols))


def _category_affinity(item_cat: np.ndarray, hist: np.ndarray, items: np.ndarray) -> list[np.ndarray]:
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


def _float(col: pd.Series) -> np.ndarray:
    return pd.to_numeric(col, errors="coerce").astype("Float64").to_numpy(dtype=np.float64, na_value=np.nan)


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
