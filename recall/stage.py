"""The recall stage: two-tower ANN search merged with the co-visitation, item-model and popularity channels.

At request time the user tower encodes the request's most recent history (and attributes)
into one vector (the tower is inductive: a user unknown at training time, or one with no
history at all, still gets a vector); the faiss index returns the nearest items; the extra
channels (``recall.item_models.NeighbourChannel``: co-visitation and EASE/item-kNN, on by
default, ``RecallConfig.extra_channels``) score items from the recent history; excluded
items are dropped; ``recall.channels.merge_channels`` merges the lists, each extra channel
getting its share of the depth (gated on valid at training time, ``recall.extra_channels``)
and the popularity channel ``popularity_share`` (``cold_popularity_share`` for an empty
history, where the two-tower vector rests on the attributes alone). By default
(``merge_order: priority``) the two-tower order stays on top, the extra channels' quotas
follow, and popularity fills the tail; for a cold user popularity leads.

Artifacts: ``<artifact_dir>/recall`` as written by ``recall.train`` and the popularity
counts of ``<artifact_dir>/split`` (at serving every interaction visible at test time; the jobs that
tune or train on earlier targets load earlier counts, see ``load``). Architecture
comes from the saved ``model.json``; serving knobs (``popularity_share``) from the stage's
``RecallConfig`` (``settings.recall``, given by ``cascade.registry``) overlaid with the stage
spec's ``params``.

Deliberately left out: re-encoding item vectors at serving time (the trained ones are
loaded) and any use of incoming candidates (recall is the first stage; it ignores them).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from offline.split import Phase, Split
from recall.channels import TWO_TOWER, Channel, PopularityChannel, merge_channels
from recall.config import DEFAULT_DEPTH, EARLY_STOPPED_DIR, RecallConfig
from recall.features import UserVocab
from recall.index import ItemIndex
from recsys.config import StageSpec
from recsys.contract import Candidates, Request
from recsys.manifest import verify_directory


class RecallStage:
    """``recsys.contract.Stage`` "recall": writes the ``recall`` rank score (plus per-channel columns)."""

    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ("recall",)

    def __init__(self, spec: StageSpec, config: RecallConfig) -> None:
        """``config`` is ``settings.recall``; ``spec.params`` override its keys (validated together)."""
        self.name = spec.name
        self.depth = spec.depth or DEFAULT_DEPTH
        self.config = config.for_stage("recall", spec.params)
        self._tower: Any = None
        self._vocab: Any = None
        self._vectors = np.zeros((0, self.config.dim), dtype=np.float32)
        self._index: Any = None
        self._popularity: PopularityChannel | None = None
        self._extra: list[Any] = []  # recall.item_models.NeighbourChannel, in config.extra_channels order
        self._tuned_shares: dict[str, float] = {}
        self._version = "unloaded"

    def load(self, artifact_dir: Any, subdir: str = "recall", phase: Phase = "test") -> None:
        """Load the user tower, item vectors, faiss index and popularity counts (once, at start-up).

        ``subdir`` selects another trained copy, e.g. ``recall_holdout`` (trained without each
        user's last ``coarse.train_positions`` training items) when producing coarse-ranker training
        candidates. The popularity counts are the ``phase``'s of ``<artifact_dir>/split`` (test:
        serving's); ``with_popularity`` gives the same stage at other counts.

        ``phase="valid"`` is for the jobs that tune or measure on valid items (the fusion gate,
        LLM adaptation, ``eval --phase valid``): a refit model (``RecallConfig.refit``) has learnt
        them, so its early-stopped copy in ``<subdir>/early_stopped`` is loaded instead when there is one.
        """
        root = Path(artifact_dir)
        model_dir = root / subdir
        _check_trained(model_dir)  # the missing model is the error to name, before the split
        verify_directory(model_dir)  # every file (and early_stopped/'s) against its digest, before torch or faiss
        refit_of = _refit_of(model_dir) if phase == "valid" else None
        if refit_of is not None:
            model_dir = model_dir / EARLY_STOPPED_DIR
            if not _is_trained(model_dir):
                raise FileNotFoundError(f"{model_dir}: the recall model in {model_dir.parent} is a refit (recall.refit) "
                                        "and the valid phase reads its early-stopped copy here, which is missing; "
                                        "retrain recall (`recsys train recall --force`)")
        self.load_from(model_dir, Split.load(root / "split").item_popularity(phase))
        if refit_of is not None and self._version != refit_of:
            raise ValueError(f"{model_dir}: this early-stopped model ({self._version}) is not the one the served refit "
                             f"model was trained after ({refit_of}): a retrain was interrupted between the two; "
                             "retrain recall (`recsys train recall --force`)")

    def load_from(self, recall_dir: Path, popularity: np.ndarray) -> None:
        """``load`` from one trained directory and given popularity counts per item, no split on disk:
        training tunes the channel shares this way, with the in-memory split's valid-time counts
        (``recall.extra_channels.train_channels``)."""
        import torch  # lazy: heavy, only once a model is loaded

        from recall.extra_channels import load_channels  # lazy: imports scipy
        from recall.towers import UserTower  # lazy: imports torch
        from recall.train import INDEX_DIR, MODEL_FILE, SPEC_FILE, VECTORS_FILE  # lazy: imports torch

        recall_dir = Path(recall_dir)
        _check_trained(recall_dir)
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
        if len(popularity) != len(vectors):
            raise ValueError(f"{recall_dir}: popularity counts {len(popularity)} items but the recall model has "
                             f"{len(vectors)}")
        self._tower, self._vocab, self._vectors, self._index = tower, vocab, vectors, index
        self._popularity = PopularityChannel(popularity)
        self._extra, self._tuned_shares = load_channels(recall_dir, self.config)
        self._version = hashlib.sha256((recall_dir / MODEL_FILE).read_bytes()).hexdigest()[:12]

    def with_popularity(self, popularity: np.ndarray) -> RecallStage:
        """This loaded stage (same model, index and channels, shared not copied) with other
        popularity counts: the coarse ranker's train groups are recalled without their labels in
        the counts (``jobs.train.holdout_recall``), where test-time counts would include each label's
        own event. ``version()`` stays the model's: it names the trained files, not the counts."""
        if self._popularity is None:
            raise RuntimeError("RecallStage.with_popularity called before load(artifact_dir)")
        if len(popularity) != self.n_items:
            raise ValueError(f"popularity counts {len(popularity)} items but the recall model has {self.n_items}")
        other = copy.copy(self)
        other._popularity = PopularityChannel(popularity)
        return other

    @property
    def n_items(self) -> int:
        return len(self._vectors)

    def version(self) -> str:
        return self._version

    def user_vectors(
        self, histories: Sequence[np.ndarray], user_attrs_list: Sequence[Mapping[str, Any]]
    ) -> np.ndarray:
        """``[n, dim]`` unit user vectors for many users at once (the evaluator's entry point).

        History items outside the model's catalog are ignored.
        """
        from recall.scoring import user_vectors  # lazy: imports torch

        if self._tower is None:
            raise RuntimeError("RecallStage.user_vectors called before load(artifact_dir)")
        if len(histories) != len(user_attrs_list):
            raise ValueError(f"{len(histories)} histories but {len(user_attrs_list)} attribute mappings")
        known = [self._known(h) for h in histories]
        attrs = np.stack([self._vocab.encode(a) for a in user_attrs_list]) if known else np.zeros((0, 3), np.int64)
        return user_vectors(self._tower, self._vectors, known, attrs)

    def item_vectors(self) -> np.ndarray:
        """The loaded ``[n_items, dim]`` item vectors (row i == item_idx i)."""
        return self._vectors

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        """Top ``depth`` items for ``request``, excluded items never among them."""
        if self._index is None or self._popularity is None:
            raise RuntimeError("RecallStage.run called before load(artifact_dir)")
        history = self._known(request.history)
        exclude = np.unique(request.excluded)
        vector = self.user_vectors([history], [request.user_attrs])
        return self.merge(self.channel_lists(history, exclude, vector), exclude, cold=not len(history))

    @property
    def shares(self) -> dict[str, float]:
        """Depth share of each extra channel: ``config.channel_shares`` if set, else the tuned ones."""
        given = self.config.channel_shares
        source = self._tuned_shares if given is None else given
        return {name: float(source.get(name, 0.0)) for name in self.config.extra_channels}

    def channel_lists(self, history: np.ndarray, exclude: np.ndarray, vector: np.ndarray) -> list[Channel]:
        """Every channel's own list (up to ``depth`` items each) for a known ``history``, excluded
        items removed, and the ``[1, dim]`` user ``vector``: two-tower, extra channels, popularity."""
        if self._index is None or self._popularity is None:
            raise RuntimeError("RecallStage.channel_lists called before load(artifact_dir)")
        k = min(self.depth + len(exclude), self.n_items)
        scores, ids = self._index.search(vector, k)
        lists: list[Channel] = [(TWO_TOWER, ids[0], scores[0])]
        lists += [(c.name, *c.candidates(history, exclude, self.depth)) for c in self._extra]
        return [*lists, (PopularityChannel.name, *self._popularity.candidates(exclude, self.depth))]

    def merge(self, lists: list[Channel], exclude: np.ndarray, cold: bool,
              shares: Mapping[str, float] | None = None) -> Candidates:
        """Merge ``channel_lists`` output with quotas: ``shares`` (default ``self.shares``) of the
        depth per extra channel, ``popularity_share`` (``cold_popularity_share`` for an empty
        history, where popularity leads and extra channels get no slots) for popularity, the
        rest for the two-tower."""
        quotas = self.quotas([name for name, _, _ in lists[1:-1]], cold, shares)
        if cold:  # a cold user's vector rests on attributes alone: popularity leads
            lists = [lists[-1], *lists[:-1]]
        return merge_channels(lists, self.depth, exclude, quotas=quotas, order=self.config.merge_order)

    def quotas(self, extra: Sequence[str], cold: bool, shares: Mapping[str, float] | None = None) -> dict[str, int]:
        """Slots per channel at this depth (see ``merge``): extra channels, then two-tower, popularity."""
        shares = self.shares if shares is None else shares
        n_pop = int(round(self.depth * (self.config.cold_popularity_share if cold else self.config.popularity_share)))
        quotas = {name: 0 if cold else int(round(self.depth * shares.get(name, 0.0))) for name in extra}
        quotas[TWO_TOWER] = max(self.depth - n_pop - sum(quotas.values()), 0)
        quotas[PopularityChannel.name] = n_pop
        return quotas

    def more(self, request: Request, size: int) -> Iterator[np.ndarray]:
        """Candidates beyond ``run``'s depth, for a list the rules left short (``recsys.pipeline``
        backfill): the whole popularity channel, ``size`` items at a time, excluded items dropped."""
        if self._popularity is None:
            raise RuntimeError("RecallStage.more called before load(artifact_dir)")
        return self._popularity.blocks(np.unique(request.excluded), size)

    def _known(self, history: np.ndarray) -> np.ndarray:
        h = np.asarray(history, dtype=np.int64)
        return h[(h >= 0) & (h < self.n_items)]


def _is_trained(recall_dir: Path) -> bool:
    from recall.train import SPEC_FILE  # lazy: imports torch

    return (recall_dir / SPEC_FILE).is_file()


def _check_trained(recall_dir: Path) -> None:
    if not _is_trained(recall_dir):
        from recall.train import SPEC_FILE  # lazy: imports torch

        raise FileNotFoundError(f"{recall_dir / SPEC_FILE}: no trained recall model here (run training first)")


def _refit_of(recall_dir: Path) -> str | None:
    """The early-stopped version a refit model in ``recall_dir`` was trained after (None: not a refit)."""
    from recall.train import SPEC_FILE  # lazy: imports torch

    spec = json.loads((recall_dir / SPEC_FILE).read_text())
    return spec.get("refit_of") if isinstance(spec, dict) else None
