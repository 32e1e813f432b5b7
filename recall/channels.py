"""Recall channels and the one place their candidates are merged.

A *channel* proposes item indices, best first, with a raw score per item: the two-tower
ANN search (``recall.model``) and ``PopularityChannel`` here. ``merge_channels`` turns any
number of channel lists into one de-duplicated ``Candidates`` set:

- every channel's list is cleaned first (padding ids -1, excluded items and repeats dropped);
- slots are dealt out by Sainte-Lague apportionment: each channel has a weight (its quota, or
  ``depth`` without one) and the next slot goes to the channel with the smallest
  ``(slots_filled + 0.5) / weight`` (ties to the earlier channel). Without quotas this is a
  plain round-robin; with quotas ``{"popularity": 20}`` at depth 200 the popularity channel
  fills about every 10th slot, its first one at position 5 rather than at the top;
- ``order="priority"`` deals the same slots channel by channel instead (the primary channel's
  quota first): the merged order then *is* the primary channel's order at the top, which is
  what a warm user's recall ranking should be; popularity only backs it up further down;
- a quota caps how many slots a channel may fill; a channel whose next item is already taken
  skips it; once every channel is capped or exhausted, the remaining slots go to the first
  channel (the primary one), past its own quota;
- flags ``src_<channel>`` mark every channel that returned an item (one item can carry
  several), ``recall_<channel>`` holds that channel's raw score (NaN where it did not return
  the item), and ``recall`` is the merged rank score ``1 / (1 + position)``.

``ChannelQuotas`` turns the recall config's shares into the quotas of one merge at the stage
depth, for serving and for the training-time gate of the shares alike.

Deliberately left out: score-based fusion across channels (raw scores of different channels
are not comparable; the coarse ranker learns how to weigh them).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from recall.config import RecallConfig
from recsys.contract import Candidates
from recsys.names import RECALL_SCORE_PREFIX, SOURCE_FLAG_PREFIX, TWO_TOWER

Channel = tuple[str, np.ndarray, np.ndarray]  # (name, ids best first, raw scores)


class PopularityChannel:
    """Most popular items first (ties to the lower item index), excluded items removed.

    Built by the recall stage's ``load`` from interaction counts; the fallback for cold users.
    """

    name = "popularity"

    def __init__(self, popularity: np.ndarray) -> None:
        pop = np.asarray(popularity, dtype=np.float64)
        if pop.ndim != 1 or not np.isfinite(pop).all():
            raise ValueError(f"popularity must be a finite 1-d array per item, got shape {pop.shape}")
        self.popularity = pop.astype(np.float32)
        # Stable sort on -popularity keeps equal counts in item-index order.
        self._order = np.argsort(-pop, kind="stable").astype(np.int64)

    def candidates(self, exclude: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``n`` most popular items not in ``exclude``: (ids int64, scores float32)."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        exclude = np.asarray(exclude, dtype=np.int64)
        head = self._order[: n + len(exclude)]
        ids = head[~np.isin(head, exclude)][:n]
        return ids, self.popularity[ids]

    def blocks(self, exclude: np.ndarray, size: int) -> Iterator[np.ndarray]:
        """Every item not in ``exclude``, most popular first, ``size`` at a time (backfill)."""
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        exclude = np.asarray(exclude, dtype=np.int64)
        for start in range(0, len(self._order), size):
            block = self._order[start:start + size]
            yield block[~np.isin(block, exclude)]


def clean_channel(
    ids: np.ndarray, scores: np.ndarray, excluded: np.ndarray, name: str, *, blocked: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """A channel list without padding ids (-1), ``excluded`` items and repeats, in channel order.

    ``blocked``: ``excluded`` as a bool mask over item indices, longer than every id (``merge_channels``
    builds it once for all its channels instead of one set look-up per channel).
    """
    ids = np.asarray(ids, dtype=np.int64).ravel()
    scores = np.asarray(scores, dtype=np.float32).ravel()
    if len(ids) != len(scores):
        raise ValueError(f"channel {name!r} has {len(ids)} ids but {len(scores)} scores")
    if blocked is None:
        keep = (ids >= 0) & ~np.isin(ids, excluded)
    else:
        keep = ids >= 0
        keep[keep] = ~blocked[ids[keep]]
    ids, scores = ids[keep], scores[keep]
    _, first = np.unique(ids, return_index=True)
    first.sort()  # keep each id's first (best) occurrence, in channel order
    return ids[first], scores[first]


def priority_items(cleaned: list[np.ndarray], caps: list[int], depth: int) -> np.ndarray:
    """The items of a priority merge (``merge_channels(..., order="priority")``) of cleaned channel
    lists (``clean_channel``) with per-channel caps, in merge order: each channel in turn takes its
    next ``cap`` items not yet taken, then the first channel fills what is left. Vectorised: the
    served path runs it once per request and the quota search thousands of times.

    >>> priority_items([np.array([1, 2, 3, 4]), np.array([2, 5, 6])], [2, 2], 5).tolist()
    [1, 2, 5, 6, 3]
    """
    is_taken = np.zeros(1 + max((int(ids.max()) for ids in cleaned if len(ids)), default=-1), dtype=bool)
    taken: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
    n_taken = 0
    for ids, cap in zip(cleaned, caps, strict=True):
        free = ids[~is_taken[ids]][: max(min(cap, depth - n_taken), 0)]
        is_taken[free] = True
        taken.append(free)
        n_taken += len(free)
    if cleaned and n_taken < depth:
        taken.append(cleaned[0][~is_taken[cleaned[0]]][: depth - n_taken])
    return np.concatenate(taken)


def _deal_slots(lists: list[np.ndarray], weights: list[float], caps: list[int], depth: int) -> list[int]:
    """Sainte-Lague interleave of ``lists`` into at most ``depth`` distinct items (``priority_items``
    is the other order: the channels fill their quotas one after another)."""
    taken: set[int] = set()
    merged: list[int] = []
    pos = [0] * len(lists)
    filled = [0] * len(lists)

    def next_free(c: int) -> int | None:
        while pos[c] < len(lists[c]) and int(lists[c][pos[c]]) in taken:
            pos[c] += 1
        return int(lists[c][pos[c]]) if pos[c] < len(lists[c]) else None

    while len(merged) < depth:
        heads = {c: next_free(c) for c in range(len(lists)) if filled[c] < caps[c]}
        open_ = {c: item for c, item in heads.items() if item is not None}
        if not open_:
            break
        c = min(open_, key=lambda c: ((filled[c] + 0.5) / weights[c], c))
        item = open_[c]
        merged.append(item)
        taken.add(item)
        filled[c] += 1
    while lists and len(merged) < depth and (extra := next_free(0)) is not None:
        merged.append(extra)  # every channel capped or exhausted: the primary channel fills the rest
        taken.add(extra)
    return merged


def merge_channels(
    channels: list[Channel], depth: int, exclude: np.ndarray, quotas: dict[str, int] | None = None,
    order: str = "interleave",
) -> Candidates:
    """Merge channel lists into at most ``depth`` candidates sorted by ``recall`` (see module doc).

    Example: channels ``[("ann", [4, 7, 2], ...), ("popularity", [7, 9], ...)]``, depth 4,
    no exclusion -> items ``[4, 7, 2, 9]``; item 7 has both ``src_ann`` and ``src_popularity``.
    """
    if depth < 0:
        raise ValueError(f"depth must be >= 0, got {depth}")
    if order not in ("interleave", "priority"):
        raise ValueError(f"order must be 'interleave' or 'priority', got {order!r}")
    names = [name for name, _, _ in channels]
    if len(set(names)) != len(names):
        raise ValueError(f"channel names must be unique, got {names}")
    quotas = dict(quotas or {})
    if unknown := set(quotas) - set(names):
        raise ValueError(f"quotas name unknown channels {sorted(unknown)}; channels are {names}")
    if bad := {k: v for k, v in quotas.items() if v < 0}:
        raise ValueError(f"quotas must be >= 0, got {bad}")
    excluded = np.asarray(exclude, dtype=np.int64).ravel()
    raw_ids = [np.asarray(ids, dtype=np.int64).ravel() for _, ids, _ in channels]
    blocked = np.zeros(1 + max([int(ids.max()) for ids in raw_ids if len(ids)], default=-1), dtype=bool)
    blocked[excluded[(excluded >= 0) & (excluded < len(blocked))]] = True
    cleaned = [clean_channel(ids, scores, excluded, name, blocked=blocked)
               for (name, _, scores), ids in zip(channels, raw_ids, strict=True)]
    caps = [quotas.get(name, depth) for name in names]
    weights = [max(cap, 1e-9) for cap in caps]  # a quota of 0 never wins a slot
    lists = [ids for ids, _ in cleaned]
    items = (priority_items(lists, caps, depth).astype(np.int64) if order == "priority"
             else np.asarray(_deal_slots(lists, weights, caps, depth), dtype=np.int64))

    scores: dict[str, np.ndarray] = {"recall": (1.0 / (1.0 + np.arange(len(items)))).astype(np.float32)}
    flags: dict[str, np.ndarray] = {}
    for name, (ids, raw) in zip(names, cleaned, strict=True):
        by_id = np.argsort(ids)
        where = np.searchsorted(ids[by_id], items)
        where = np.minimum(where, max(len(ids) - 1, 0))
        found = (ids[by_id][where] == items) if len(ids) else np.zeros(len(items), dtype=bool)
        flags[f"{SOURCE_FLAG_PREFIX}{name}"] = found
        col = np.full(len(items), np.nan, dtype=np.float32)
        col[found] = raw[by_id][where[found]]
        scores[f"{RECALL_SCORE_PREFIX}{name}"] = col
    return Candidates(items=items, scores=scores, flags=flags, order_by="recall")


@dataclass(frozen=True)
class ChannelQuotas:
    """How the recall stage's channel lists are merged at its ``depth``: the extra channels' depth
    shares (``config.channel_shares`` if set, else ``tuned``: the ones gated at training time,
    ``recall.extra_channels``), the popularity share and the merge order of ``config``.

    The serving stage and the training-time gate of the shares merge through the same object.
    """

    config: RecallConfig
    depth: int
    tuned: Mapping[str, float] = field(default_factory=dict)

    @property
    def shares(self) -> dict[str, float]:
        """Depth share of each extra channel: ``config.channel_shares`` if set, else the tuned ones."""
        given = self.config.channel_shares
        source = self.tuned if given is None else given
        return {name: float(source.get(name, 0.0)) for name in self.config.extra_channels}

    def quotas(self, extra: Sequence[str], cold: bool, shares: Mapping[str, float] | None = None) -> dict[str, int]:
        """Slots per channel at this depth (see ``merge``): extra channels, then two-tower, popularity."""
        shares = self.shares if shares is None else shares
        n_pop = int(round(self.depth * (self.config.cold_popularity_share if cold else self.config.popularity_share)))
        quotas = {name: 0 if cold else int(round(self.depth * shares.get(name, 0.0))) for name in extra}
        quotas[TWO_TOWER] = max(self.depth - n_pop - sum(quotas.values()), 0)
        quotas[PopularityChannel.name] = n_pop
        return quotas

    def merge(self, lists: list[Channel], exclude: np.ndarray, cold: bool,
              shares: Mapping[str, float] | None = None) -> Candidates:
        """Merge channel lists (two-tower first, popularity last, the extra channels between) with
        quotas: ``shares`` (default ``self.shares``) of the depth per extra channel,
        ``popularity_share`` (``cold_popularity_share`` for an empty history, where popularity
        leads and extra channels get no slots) for popularity, the rest for the two-tower."""
        quotas = self.quotas([name for name, _, _ in lists[1:-1]], cold, shares)
        if cold:  # a cold user's vector rests on attributes alone: popularity leads
            lists = [lists[-1], *lists[:-1]]
        return merge_channels(lists, self.depth, exclude, quotas=quotas, order=self.config.merge_order)
