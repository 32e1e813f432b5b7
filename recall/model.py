"""A trained recall directory, loaded: user tower, item vectors, faiss index and extra channels.

``RecallModel.load`` reads what ``recall.train`` wrote (``recall.artifacts`` names the files)
and checks that the index, the vectors and ``model.json`` agree. The loaded model encodes
users (``user_vectors``) and lists each channel's own candidates for one user
(``channel_lists``). Both the serving stage (``recall.stage``) and the training-time gate of the
channel shares (``recall.extra_channels``) read through it.

Deliberately left out: popularity counts (they depend on the phase and on the caller; passed
in), merging the lists (``recall.channels.ChannelQuotas``) and writing anything.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from recall.artifacts import (
    CHANNELS_DIR,
    CHANNELS_FILE,
    INDEX_DIR,
    MODEL_FILE,
    SPEC_FILE,
    VECTORS_FILE,
    check_trained,
)
from recall.channels import Channel, PopularityChannel
from recall.config import RecallConfig
from recall.features import UserVocab
from recall.index import ItemIndex
from recsys.names import TWO_TOWER

if TYPE_CHECKING:
    from offline.item_neighbours import NeighbourChannel


@dataclass(frozen=True)
class RecallModel:
    """The loaded artifacts of one recall directory (read-only, shared by copies of a stage)."""

    tower: Any  # recall.towers.UserTower, in eval mode
    vocab: UserVocab
    vectors: np.ndarray  # [n_items, dim] float32, row i == item_idx i
    index: ItemIndex
    extra: list[NeighbourChannel]  # in config.extra_channels order
    tuned_shares: dict[str, float]
    version: str  # the first 12 hex digits of model.pt's SHA-256

    @classmethod
    def load(cls, recall_dir: Path, config: RecallConfig) -> RecallModel:
        """Load ``recall_dir`` with the extra channels ``config`` turns on; ``ValueError`` where the
        index, the vectors and ``model.json`` disagree on the item count."""
        import torch  # lazy: heavy, only once a model is loaded

        from recall.towers import UserTower  # lazy: imports torch

        recall_dir = Path(recall_dir)
        check_trained(recall_dir)
        spec = json.loads((recall_dir / SPEC_FILE).read_text())
        arch = RecallConfig.model_validate(spec["config"])
        vocab = UserVocab.from_json(spec["user_vocab"])
        tower = UserTower(arch.dim, arch.max_len, arch.n_blocks, arch.n_heads, 0.0, vocab.sizes)
        state = torch.load(recall_dir / MODEL_FILE, map_location="cpu", weights_only=True)
        tower.load_state_dict(state["user_tower"])
        tower.eval()
        vectors = np.load(recall_dir / VECTORS_FILE).astype(np.float32)
        index = ItemIndex.load(recall_dir / INDEX_DIR)
        if index.ntotal != len(vectors) or len(vectors) != spec["n_items"]:
            raise ValueError(f"{recall_dir}: index holds {index.ntotal} items, item_vectors {len(vectors)}, "
                             f"model.json says {spec['n_items']}")
        extra, tuned = load_channels(recall_dir, config)
        version = hashlib.sha256((recall_dir / MODEL_FILE).read_bytes()).hexdigest()[:12]
        return cls(tower, vocab, vectors, index, extra, tuned, version)

    @property
    def n_items(self) -> int:
        return len(self.vectors)

    def known(self, history: np.ndarray) -> np.ndarray:
        """``history`` without the items outside the model's catalog."""
        h = np.asarray(history, dtype=np.int64)
        return h[(h >= 0) & (h < self.n_items)]

    def user_vectors(self, histories: Sequence[np.ndarray], user_attrs_list: Sequence[Mapping[str, Any]]
                     ) -> np.ndarray:
        """``[n, dim]`` unit user vectors for many users at once; history items outside the model's
        catalog are ignored."""
        from recall.scoring import user_vectors  # lazy: imports torch

        if len(histories) != len(user_attrs_list):
            raise ValueError(f"{len(histories)} histories but {len(user_attrs_list)} attribute mappings")
        known = [self.known(h) for h in histories]
        attrs = np.stack([self.vocab.encode(a) for a in user_attrs_list]) if known else np.zeros((0, 3), np.int64)
        return user_vectors(self.tower, self.vectors, known, attrs)

    def channel_lists(self, history: np.ndarray, exclude: np.ndarray, vector: np.ndarray,
                      popularity: PopularityChannel, depth: int) -> list[Channel]:
        """Every channel's own list (up to ``depth`` items each) for a known ``history``, excluded
        items removed, and the ``[1, dim]`` user ``vector``: two-tower, extra channels, popularity."""
        k = min(depth + len(exclude), self.n_items)
        scores, ids = self.index.search(vector, k)
        lists: list[Channel] = [(TWO_TOWER, ids[0], scores[0])]
        lists += [(c.name, *c.candidates(history, exclude, depth)) for c in self.extra]
        return [*lists, (PopularityChannel.name, *popularity.candidates(exclude, depth))]


def load_channels(recall_dir: Path, config: RecallConfig) -> tuple[list[NeighbourChannel], dict[str, float]]:
    """The extra channels ``config`` turns on, from ``recall_dir``, and their tuned shares."""
    from scipy import sparse  # lazy: loading a model is the first use of scipy on the serving path

    from offline.item_neighbours import NeighbourChannel  # lazy: imports scipy

    names = config.extra_channels
    if not names:
        return [], {}
    path = Path(recall_dir) / CHANNELS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: recall channels {list(names)} are on but were not trained here "
                                "(retrain recall with them on)")
    meta = json.loads(path.read_text())
    if missing := [n for n in names if n not in meta["channels"]]:
        raise FileNotFoundError(f"{path}: channels {missing} are on but were not trained here")
    channels = [NeighbourChannel(n, sparse.load_npz(Path(recall_dir) / CHANNELS_DIR / f"{n}.npz").tocsr(),
                                 meta["channels"][n]["last_n"]) for n in names]
    return channels, {n: float(meta["shares"].get(n, 0.0)) for n in names}
