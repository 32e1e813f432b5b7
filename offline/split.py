"""The leave-one-out split every trainer and evaluator shares.

``Split`` is what ``offline.protocol.make_split`` returns: the k-core-filtered catalog and
users encoded to contiguous indices, each user's time-ordered training sequence, and one
held-out valid and one test item per user (LlamaRec / LRURec protocol: last interaction ->
test, second last -> valid, the rest -> train).

Evaluation inputs per phase (``history(u, phase)``):
- ``"valid"``: input = train sequence, target = valid item;
- ``"test"``: input = train sequence + valid item, target = test item.
Full ranking excludes every item of the input history.

Deliberately left out: how the split is computed (``offline.protocol``), metrics
(``offline.metrics``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO, Any, Literal

import numpy as np
import pandas as pd

from offline.loaders import SYNTHETIC, format_of_files, item_noun
from offline.schema import Vocab, user_attributes
from recsys.atomic import atomic_write, atomic_write_json
from recsys.contract import Request

Phase = Literal["train", "valid", "test"]
OUTSIDE_FILE = "outside_users.parquet"


@dataclass
class Split:
    name: str
    vocab: Vocab
    items: pd.DataFrame  # canonical items table, row i == item_idx i
    users: pd.DataFrame  # canonical users table, row u == user_idx u
    train: pd.DataFrame  # columns user_idx, item_idx, rating, timestamp; sorted by (user_idx, timestamp)
    valid: np.ndarray  # [n_users] int64 item_idx
    test: np.ndarray  # [n_users] int64 item_idx
    valid_ts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    test_ts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    protocol: dict = field(default_factory=dict)  # e.g. {"k_core": 5, "split": "leave-one-out"}
    # users outside the k-core, for serving only: users-table columns + "history" (item indices,
    # oldest first); None for a split saved before it existed (``offline.protocol.outside_users``)
    outside: pd.DataFrame | None = None
    _seqs: list[np.ndarray] | None = field(default=None, repr=False)
    _attrs: list[dict[str, Any]] | None = field(default=None, repr=False)

    @property
    def n_users(self) -> int:
        return self.vocab.n_users

    @property
    def n_items(self) -> int:
        return self.vocab.n_items

    @property
    def train_sequences(self) -> list[np.ndarray]:
        """Per user, the time-ordered training item indices (cached)."""
        if self._seqs is None:
            seqs: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * self.n_users
            users = self.train["user_idx"].to_numpy()
            items = self.train["item_idx"].to_numpy(dtype=np.int64)
            bounds = np.flatnonzero(np.diff(users)) + 1
            starts = np.concatenate([[0], bounds])
            ends = np.concatenate([bounds, [len(users)]])
            for s, e in zip(starts, ends, strict=True):
                if e > s:
                    seqs[int(users[s])] = items[s:e]
            self._seqs = seqs
        return self._seqs

    def history(self, user_idx: int, phase: Phase) -> np.ndarray:
        """The input history for ``phase`` (see module docstring)."""
        seq = self.train_sequences[user_idx]
        if phase == "train":
            return seq
        if phase == "valid":
            return seq
        if phase == "test":
            return np.append(seq, self.valid[user_idx])
        raise ValueError(f"phase must be 'train', 'valid' or 'test', got {phase!r}")

    def user_attrs(self, user_idx: int) -> dict[str, Any]:
        """The user's known attributes (``offline.schema.user_attributes``), NA dropped."""
        if self._attrs is None:
            self._attrs = user_attributes(self.users)
        return dict(self._attrs[user_idx])

    def request(self, user_idx: int, history: np.ndarray, *, k: int = 10, request_id: str = "") -> Request:
        """The ``Request`` of user ``user_idx`` with ``history`` as its input: the user's id, index and
        attributes. The one builder of requests from the split (eval, coarse and LLM training, benchmarks)."""
        return Request(user_id=str(self.vocab.user_ids[user_idx]), k=k, user_idx=int(user_idx),
                       history=history, user_attrs=self.user_attrs(user_idx), request_id=request_id)

    def targets(self, phase: Phase) -> np.ndarray:
        if phase == "valid":
            return self.valid
        if phase == "test":
            return self.test
        raise ValueError(f"targets exist for 'valid' and 'test' only, got {phase!r}")

    @property
    def unseen_items(self) -> np.ndarray:
        """Items whose interactions training must not see (the new items of ``jobs.evaluation.cold_items``);
        steps that learn from valid items skip the users whose valid item is one of them."""
        return np.asarray(self.protocol.get("cold_items", {}).get("items", []), dtype=np.int64)

    def valid_trainable(self) -> np.ndarray:
        """Bool per user: their valid item may be learnt from (not an ``unseen_items`` one)."""
        return ~np.isin(self.valid, self.unseen_items)

    def item_popularity(self, phase: Phase = "valid") -> np.ndarray:
        """Interaction counts per item over what a model may see before ``phase``'s targets."""
        counts = np.bincount(self.train["item_idx"].to_numpy(), minlength=self.n_items).astype(np.float64)
        if phase == "test":
            counts += np.bincount(self.valid, minlength=self.n_items)
        return counts

    # -- persistence -------------------------------------------------------------------
    def save(self, directory: Path) -> None:
        """Write the split; ``split.json``, written last, marks it complete.

        Over an existing split the old marker goes first: a save killed half-way leaves no
        split (``load`` refuses it), never new tables beside old ones that still look complete.
        Each table goes through a temporary file renamed into place.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "split.json").unlink(missing_ok=True)
        holdout = pd.DataFrame(
            {"user_id": self.vocab.user_ids.astype(str), "valid": self.valid, "test": self.test,
             "valid_ts": self.valid_ts, "test_ts": self.test_ts}
        )
        for name, frame in (("items", self.items), ("users", self.users), ("train", self.train),
                            ("holdout", holdout)):
            atomic_write(directory / f"{name}.parquet", partial(_write_parquet, frame))
        if self.outside is not None:
            self.save_outside(directory)
        atomic_write_json(directory / "split.json", {"name": self.name, "protocol": self.protocol})

    def save_outside(self, directory: Path) -> None:
        """Write ``outside`` alone (``outside_users.parquet``): not part of the split's identity
        (``split_id``), so adding it to a split saved before it existed retrains nothing."""
        if self.outside is None:
            raise ValueError("Split.save_outside: this split has no outside users table")
        frame = self.outside.assign(history=[np.asarray(h, np.int64) for h in self.outside["history"]])
        atomic_write(Path(directory) / OUTSIDE_FILE, partial(_write_parquet, frame))

    @classmethod
    def load(cls, directory: Path) -> Split:
        directory = Path(directory)
        if not (directory / "split.json").exists():
            raise FileNotFoundError(f"{directory / 'split.json'}: no saved split here")
        meta = json.loads((directory / "split.json").read_text())
        items = pd.read_parquet(directory / "items.parquet")
        users = pd.read_parquet(directory / "users.parquet")
        hold = pd.read_parquet(directory / "holdout.parquet")
        vocab = Vocab.build(hold["user_id"], items["item_id"])
        return cls(
            name=meta["name"], vocab=vocab, items=items, users=users,
            train=pd.read_parquet(directory / "train.parquet"),
            valid=hold["valid"].to_numpy(np.int64), test=hold["test"].to_numpy(np.int64),
            valid_ts=hold["valid_ts"].to_numpy(np.int64), test_ts=hold["test_ts"].to_numpy(np.int64),
            protocol=meta["protocol"],
            outside=pd.read_parquet(directory / OUTSIDE_FILE) if (directory / OUTSIDE_FILE).exists() else None,
        )


def _write_parquet(frame: pd.DataFrame, fh: IO[bytes]) -> None:
    frame.to_parquet(fh, index=False)


def source_record(artifact_dir: Path) -> dict[str, Any]:
    """``<artifact_dir>/split/source.json`` as written by ``jobs.prepare`` (what the split was
    prepared from); {} when there is none or it is not a readable JSON object."""
    path = Path(artifact_dir) / "split" / "source.json"
    try:
        record = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def prepared_item_noun(artifact_dir: Path, configured: str | None = None) -> str:
    """The prompt's word for an item: ``configured`` (``llm.domain``) when set, else the word for an
    item of the dataset the split under ``artifact_dir`` was prepared from
    (``offline.loaders.item_noun``): the word a derived split recorded (the cold-item cascade's),
    else that of its recorded format, else of the layout its recorded file names mark, the
    synthetic set's when it was generated; the generic word without a record."""
    if configured:
        return configured
    record = source_record(artifact_dir)
    if isinstance(noun := record.get("item_noun"), str) and noun:  # a split derived from another keeps its word
        return noun
    files = record.get("files")
    if record.get("data") == SYNTHETIC and not files:
        return item_noun(SYNTHETIC)
    fmt = record.get("format")
    return item_noun(fmt if isinstance(fmt, str) else format_of_files(files if isinstance(files, dict) else ()))


def split_id(artifact_dir: Path) -> str:
    """Identity of the split under ``artifact_dir/split`` that stages train on (its source
    fingerprint and protocol); every trained stage records it in its ``stage.json``."""
    parts = [(Path(artifact_dir) / "split" / n).read_bytes() for n in ("source.json", "split.json")
             if (Path(artifact_dir) / "split" / n).exists()]
    return hashlib.sha256(b"".join(parts)).hexdigest()[:16]
