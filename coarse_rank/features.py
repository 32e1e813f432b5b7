"""Coarse-ranker features: (request, candidates) -> float32 matrix [n_candidates, n_features].

``FeatureBuilder.fit`` computes lookup tables from training interactions only (see
``coarse_rank.statistics``); ``transform`` then builds one request's matrix with array
lookups, no per-candidate Python loop. NaN marks a missing value (LightGBM routes it).
Feature names are stable for a fitted builder: the ``FEATURES`` (``coarse_rank.feature_names``), the ``TAG_FEATURES``
when ``CoarseConfig.tag_features`` is on (looked up in ``coarse_rank.item_tags.ItemTags``,
saved with the builder), the ``LLM_EMBEDDING_FEATURES`` when ``CoarseConfig.llm_embedding_features``
is on (``coarse_rank.llm_features``), the ``coarse_rank.channel_features`` columns when
``CoarseConfig.channel_features`` is on (the default), then the recall channel columns seen at fit time
(``recall_<channel>`` scores, ``src_<channel>`` flags as 0/1); a channel absent from a
request reads NaN, an unknown one is ignored.

The parts: the fitted lookups (``coarse_rank.feature_tables``), the column groups
(``coarse_rank.feature_columns``, ``coarse_rank.channel_features``, ``coarse_rank.item_tags``),
the files (``coarse_rank.feature_store``). The follow counts stay here with ``_dense_block``,
the sparse lookup ``tests/serving/test_served_rankings.py`` checks against scipy.

Deliberately left out: candidate generation and labels (``coarse_rank.dataset``), the model
(``coarse_rank.train``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import sparse

from coarse_rank.channel_features import CHANNEL_FEATURES, ChannelTables, rank_names
from coarse_rank.config import CoarseConfig
from coarse_rank.feature_columns import category_affinity, recall_columns, tag_columns, user_columns
from coarse_rank.feature_names import FEATURES, INTERACTION_FEATURES, TAG_FEATURES
from coarse_rank.feature_tables import FeatureTables, Vocabularies
from coarse_rank.item_age import ITEM_AGE_FEATURES, ItemAge
from coarse_rank.item_tags import ItemTags
from coarse_rank.llm_features import LLM_EMBEDDING_FEATURES, ItemEmbeddings, check_embeddings
from offline.item_neighbours import row_entries
from offline.split import Split
from recsys.contract import Candidates, Request
from recsys.names import RECALL_SCORE_PREFIX, SOURCE_FLAG_PREFIX, TWO_TOWER


class FeatureBuilder:
    """Fitted once per training run; ``transform`` is called per request by the stage."""

    def __init__(self, config: CoarseConfig | None = None, *, columns: tuple[Sequence[str], Sequence[str]] = ((), ()),
                 vocab: Vocabularies | None = None, tables: FeatureTables | None = None,
                 tags: ItemTags | None = None, channels: ChannelTables | None = None,
                 llm: ItemEmbeddings | None = None, age: ItemAge | None = None) -> None:
        """An unfitted builder (``fit`` fills it), or a fitted one from its parts
        (``coarse_rank.feature_store.load_builder``): the recall score and flag ``columns``, the
        vocabularies, the tables, the item tags and the channel tables."""
        self.config = config or CoarseConfig()
        self.score_columns, self.flag_columns = tuple(columns[0]), tuple(columns[1])
        self.vocab = vocab or Vocabularies([], [], [])
        self._t = tables
        self.tags = tags
        self.channels = channels
        self.llm = llm  # coarse_rank.llm_features, with config.llm_embedding_features
        self.age = age  # coarse_rank.item_age, with config.item_age_features

    @property
    def feature_names(self) -> list[str]:
        tag_names = TAG_FEATURES if self.config.tag_features else {}
        channel_names = [*CHANNEL_FEATURES, *rank_names(self.score_columns)] if self.config.channel_features else []
        llm_names = LLM_EMBEDDING_FEATURES if self.config.llm_embedding_features is True else {}
        age_names = ITEM_AGE_FEATURES if self.config.item_age_features else {}
        return [*FEATURES, *tag_names, *llm_names, *age_names, *channel_names, *self.score_columns,
                *self.flag_columns]

    @property
    def tables(self) -> FeatureTables:
        if self._t is None:
            raise RuntimeError("FeatureBuilder is not fitted: call fit(split) or feature_store.load_builder(dir)")
        return self._t

    @property
    def n_items(self) -> int:
        return len(self.tables.log_pop)

    @property
    def interaction_columns(self) -> tuple[np.ndarray, np.ndarray]:
        """(columns a new item has NaN in, flag columns it has 0 in), as positions in ``transform``'s matrix:
        ``INTERACTION_FEATURES`` and the scores, ranks and source flags of every recall channel that
        lists items from their interactions (all but the content-aware two-tower)."""
        names = self.feature_names
        channels = {c.removeprefix(RECALL_SCORE_PREFIX) for c in self.score_columns} - {TWO_TOWER}
        nan = (set(INTERACTION_FEATURES) | {f"{RECALL_SCORE_PREFIX}{c}" for c in channels}
               | {f"rank_{c}" for c in channels})
        zero = {f"{SOURCE_FLAG_PREFIX}{c}" for c in channels}
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
        return self.tables.log_pop > 0

    def fit(
        self,
        split: Split,
        interactions: pd.DataFrame | None = None,
        *,
        score_columns: Sequence[str] = (),
        flag_columns: Sequence[str] = (),
        tags: ItemTags | None = None,
        llm: ItemEmbeddings | None = None,
    ) -> FeatureBuilder:
        """Fit on ``interactions`` (default ``split.train``; same layout, sorted by user then time).

        Only the item/user attribute tables of ``split`` are read besides ``interactions``.
        ``tags`` (required exactly when ``config.tag_features``) and ``llm`` (exactly when
        ``config.llm_embedding_features``) are kept as given: their embeddings must not have been
        trained on what the labels of ``interactions`` hold.
        """
        cfg, n = self.config, split.n_items
        self.tags = check_tags(cfg, tags, n)
        self.llm = check_embeddings(cfg, llm, n)
        df = split.train if interactions is None else interactions
        users, items = df["user_idx"].to_numpy(np.int64), df["item_idx"].to_numpy(np.int64)
        if len(items) and (items.min() < 0 or items.max() >= n):
            raise ValueError(f"FeatureBuilder.fit: item_idx outside [0, {n}) in interactions")
        self.score_columns, self.flag_columns = tuple(score_columns), tuple(flag_columns)
        self._t, self.vocab = FeatureTables.fit(split, df, cfg)
        self.age = ItemAge.fit(items, df["timestamp"].to_numpy(np.int64), n) if cfg.item_age_features else None
        self.channels = ChannelTables.fit(users, items, n, cfg) if cfg.channel_features else None
        return self

    def transform(self, request: Request, candidates: Candidates) -> np.ndarray:
        """The [len(candidates), n_features] float32 matrix for one request (see ``FEATURES``)."""
        t, items = self.tables, candidates.items
        if len(items) and (items.min() < 0 or items.max() >= self.n_items):
            bad = items[(items < 0) | (items >= self.n_items)][0]
            raise ValueError(f"candidate item_idx {bad} outside the fitted catalog [0, {self.n_items})")
        hist = request.history[(request.history >= 0) & (request.history < self.n_items)]
        cols = [
            *recall_columns(candidates.score("recall")),
            t.log_pop[items], t.recent_pop[items], t.year[items], t.audience[items], t.mean_rating[items],
            t.item_cat[items].sum(axis=1),
            np.full(len(items), len(hist), dtype=np.float32),
            *category_affinity(t.item_cat, hist, items),
            *self._follow_columns(hist, items),
            *user_columns(t, self.vocab, request, items),
            *(tag_columns(self._item_tags, hist, items, self.config.last_n) if self.config.tag_features else []),
            *(self.llm.columns(hist, items, self.config.last_n) if self.llm is not None else []),
            *(self.age.columns(items) if self.age is not None else []),
            *(self.channels.columns(hist, candidates, self.score_columns) if self.channels is not None else []),
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

    def _follow_columns(self, hist: np.ndarray, items: np.ndarray) -> list[np.ndarray]:
        n = len(items)
        if len(hist) == 0 or n == 0:
            return [np.full(n, np.nan, np.float32)] * 5
        last = hist[-self.config.last_n:][::-1]  # most recent first
        t = self.tables
        sub = _dense_block(t.follow, last, items)  # [len(last), n]
        out_deg = max(float(t.follow_out[last[0]]), 1.0)
        precede = _dense_block(t.follow_t, last[:1], items)[0]  # follow[item, last]
        return [sub[0], sub[0] / out_deg, sub.sum(axis=0), sub.max(axis=0), precede]

    @property
    def _item_tags(self) -> ItemTags:
        if self.tags is None:
            raise RuntimeError("FeatureBuilder has no item tags: fit(..., tags=ItemTags) with tag_features on")
        return self.tags


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
