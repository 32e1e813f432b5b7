"""What the server knows about users and items, loaded once from the saved ``Split``.

``CatalogState`` maps the external ids of the HTTP API to the contiguous indices the stages
work on, and turns one API call into a ``recsys.contract.Request``:

- a known user gets its ``user_idx``, its attributes and its full observed history
  (training sequence + valid item + test item, oldest first: serving sees everything the
  split observed, unlike the offline evaluator which hides the held-out items);
- a user outside the split's k-core (too few events to evaluate, or listed in the users table
  with none: ``Split.outside``) is unknown to the trained models (``user_idx`` None) but not a
  stranger: the request carries their attributes (so the adult gate sees their age) and their
  history on the catalog, which is also never recommended back;
- an unknown user is a cold start: ``user_idx`` None, empty history, no attributes.

Histories sit behind the small ``HistoryStore`` protocol; ``SplitHistories`` is the
in-memory store built from the split. Online, ``serving.online_state`` keeps each user's recent
history in Redis (seeded from this store) and passes it to ``request_for``; this store is
also what the service falls back to while Redis is down.

Deliberately left out: real-time event ingestion (``serving.online_state``), item features
(stages load their own).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from offline.schema import user_attributes
from offline.split import Split
from recsys.contract import Request
from recsys.names import canonical, id_index


class HistoryStore(Protocol):
    """Per-user item history, oldest first. Called on the request thread, once per request."""

    def history(self, user_idx: int) -> np.ndarray: ...


@dataclass(frozen=True)
class SplitHistories:
    """In-memory histories: ``sequences[user_idx]`` is that user's time-ordered item indices."""

    sequences: list[np.ndarray]

    @classmethod
    def from_split(cls, split: Split) -> SplitHistories:
        train = split.train_sequences
        seqs = [
            np.concatenate([train[u], split.valid[u : u + 1], split.test[u : u + 1]]).astype(np.int64)
            for u in range(split.n_users)
        ]
        return cls(seqs)

    def history(self, user_idx: int) -> np.ndarray:
        if not 0 <= user_idx < len(self.sequences):
            raise IndexError(f"user_idx {user_idx} out of range [0, {len(self.sequences)})")
        return self.sequences[user_idx]


class CatalogState:
    """Id maps, titles, user attributes and histories; built by ``load`` at start-up."""

    def __init__(
        self,
        user_ids: np.ndarray,
        item_ids: np.ndarray,
        titles: np.ndarray,
        attrs: list[dict[str, Any]],
        histories: HistoryStore,
        outside: Mapping[str, tuple[dict[str, Any], np.ndarray]] | None = None,
    ):
        if len(user_ids) != len(attrs):
            raise ValueError(f"CatalogState: {len(user_ids)} user ids but {len(attrs)} attribute rows")
        if len(item_ids) != len(titles):
            raise ValueError(f"CatalogState: {len(item_ids)} item ids but {len(titles)} titles")
        # also in the one spelling requests arrive in (recsys.names), for a split saved before ids were NFC
        self.user_index = id_index(user_ids)
        self.item_index = id_index(item_ids)
        self.item_ids = np.asarray(item_ids, dtype=object)
        self.titles = np.asarray(titles, dtype=object)
        self.attrs = attrs
        self.histories = histories
        # outside users by the one spelling requests arrive in; a split user of the same id wins
        self.outside = {canonical(uid): v for uid, v in (outside or {}).items()
                        if canonical(uid) not in self.user_index}

    @classmethod
    def from_split(cls, split: Split, histories: HistoryStore | None = None) -> CatalogState:
        return cls(
            user_ids=split.vocab.user_ids,
            item_ids=split.vocab.item_ids,
            titles=split.items["title"].to_numpy(dtype=object),
            attrs=user_attributes(split.users),
            histories=histories if histories is not None else SplitHistories.from_split(split),
            outside=None if split.outside is None else dict(zip(
                split.outside["user_id"].astype(str),
                zip(user_attributes(split.outside), (np.asarray(h, np.int64) for h in split.outside["history"]),
                    strict=True), strict=True)),
        )

    @classmethod
    def load(cls, artifact_dir: Path) -> CatalogState:
        """Read ``artifact_dir/split`` (the saved ``offline.split.Split``)."""
        return cls.from_split(Split.load(Path(artifact_dir) / "split"))

    @property
    def n_items(self) -> int:
        return len(self.item_ids)

    def request_for(
        self,
        user_id: str,
        k: int,
        context: Mapping[str, Any] | None = None,
        debug: bool = False,
        request_id: str = "",
        online_history: np.ndarray | None = None,
        deadline: float | None = None,
        variant: str | None = None,
    ) -> Request:
        """The pipeline request for external ``user_id`` (cold start when unknown), in the A/B
        ``variant`` the user was assigned (None: no experiment).

        ``online_history`` (the user's recent items from Redis, events included) replaces the
        split history as the model input; a known user still never gets an item from the
        full split history, which the capped online list may have dropped. ``user_id`` arrives in NFC,
        made so once at the edge (``serving.schemas.ExternalId``); the indices answer that spelling.
        """
        user_idx = self.user_index.get(user_id)
        common: dict[str, Any] = {"user_id": user_id, "k": k, "context": dict(context or {}), "debug": debug,
                                  "request_id": request_id, "deadline": deadline, "variant": variant}
        if user_idx is None:
            online = online_history if online_history is not None else np.zeros(0, dtype=np.int64)
            if (known := self.outside.get(user_id)) is None:
                return Request(history=online, **common)
            attrs, seen = known  # Redis never seeds an unknown user: its online list holds new events only
            return Request(history=np.concatenate([seen, online]), user_attrs=dict(attrs), **common)
        seen = self.histories.history(user_idx)
        if online_history is None:
            return Request(user_idx=user_idx, history=seen, user_attrs=dict(self.attrs[user_idx]), **common)
        return Request(user_idx=user_idx, history=online_history, exclude=np.concatenate([seen, online_history]),
                       user_attrs=dict(self.attrs[user_idx]), **common)

    def item_id(self, item_idx: int) -> str:
        return str(self.item_ids[item_idx])

    def title(self, item_idx: int) -> str:
        return str(self.titles[item_idx])
