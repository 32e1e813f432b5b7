"""The recall stage: two-tower ANN search merged with the co-visitation, item-model and popularity channels.

At request time the user tower encodes the request's most recent history (and attributes)
into one vector (the tower is inductive: a user unknown at training time, or one with no
history at all, still gets a vector); the faiss index returns the nearest items; the extra
channels (``offline.item_neighbours.NeighbourChannel``: co-visitation and EASE/item-kNN, on by
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

The stage serves; the loaded files are ``recall.model.RecallModel`` and the merge quotas
``recall.channels.ChannelQuotas``, which the training-time gate of the channel shares uses too.

Deliberately left out: re-encoding item vectors at serving time (the trained ones are
loaded) and any use of incoming candidates (recall is the first stage; it ignores them).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from offline.split import Phase, Split
from recall.artifacts import check_trained, is_trained, refit_of
from recall.channels import Channel, ChannelQuotas, PopularityChannel
from recall.config import DEFAULT_DEPTH, EARLY_STOPPED_DIR, RecallConfig
from recall.model import RecallModel
from recsys.config import StageSpec
from recsys.contract import Backfilling, Candidates, ChannelRecall, Request
from recsys.manifest import verify_directory

if TYPE_CHECKING:
    from recall.scoring import FrozenUserEncoder


class RecallStage(Backfilling, ChannelRecall):
    """``recsys.contract.Stage`` "recall": writes the ``recall`` rank score (plus per-channel columns);
    backfills from its popularity channel (``Backfilling``) and lists each channel's own candidates
    (``ChannelRecall``)."""

    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ("recall",)

    def __init__(self, spec: StageSpec, config: RecallConfig) -> None:
        """``config`` is ``settings.recall``; ``spec.params`` override its keys (validated together)."""
        self.name = spec.name
        self.depth = spec.depth or DEFAULT_DEPTH
        self.config = config.for_stage("recall", spec.params)
        self.mix = ChannelQuotas(self.config, self.depth)
        self._model: RecallModel | None = None
        self._encoder: FrozenUserEncoder | None = None
        self._popularity: PopularityChannel | None = None

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
        check_trained(model_dir)  # the missing model is the error to name, before the split
        verify_directory(model_dir)  # every file (and early_stopped/'s) against its digest, before torch or faiss
        refit = refit_of(model_dir) if phase == "valid" else None
        if refit is not None:
            model_dir = model_dir / EARLY_STOPPED_DIR
            if not is_trained(model_dir):
                raise FileNotFoundError(f"{model_dir}: the recall model in {model_dir.parent} is a refit (recall.refit) "
                                        "and the valid phase reads its early-stopped copy here, which is missing; "
                                        "retrain recall (`recsys train recall --force`)")
        popularity = Split.load(root / "split").item_popularity(phase)
        model = RecallModel.load(model_dir, self.config)
        if len(popularity) != model.n_items:
            raise ValueError(f"{model_dir}: popularity counts {len(popularity)} items but the recall model has "
                             f"{model.n_items}")
        from recall.scoring import FrozenUserEncoder  # lazy: imports torch

        self._model, self._popularity = model, PopularityChannel(popularity)
        self._encoder = FrozenUserEncoder(model.tower, model.vectors)
        self.mix = ChannelQuotas(self.config, self.depth, model.tuned_shares)
        if refit is not None and self.version() != refit:
            raise ValueError(f"{model_dir}: this early-stopped model ({self.version()}) is not the one the served "
                             f"refit model was trained after ({refit}): a retrain was interrupted between the two; "
                             "retrain recall (`recsys train recall --force`)")

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
    def model(self) -> RecallModel:
        """The loaded model (user vectors, item vectors, extra channels)."""
        if self._model is None:
            raise RuntimeError("RecallStage.model read before load(artifact_dir)")
        return self._model

    @property
    def n_items(self) -> int:
        return 0 if self._model is None else self._model.n_items

    def version(self) -> str:
        return "unloaded" if self._model is None else self._model.version

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        """Top ``depth`` items for ``request``, excluded items never among them."""
        if self._model is None or self._popularity is None or self._encoder is None:
            raise RuntimeError("RecallStage.run called before load(artifact_dir)")
        history = self._model.known(request.history)
        exclude = np.unique(request.excluded)
        vector = self._encoder(history, self._model.vocab.encode(request.user_attrs))
        return self.mix.merge(self.channel_lists(history, exclude, vector), exclude, cold=not len(history))

    def channel_lists(self, history: np.ndarray, exclude: np.ndarray, vector: np.ndarray) -> list[Channel]:
        """Every channel's own list at the stage depth (``RecallModel.channel_lists``) with this
        stage's popularity counts: what ``run`` merges, and what the evaluator reports per channel."""
        if self._model is None or self._popularity is None:
            raise RuntimeError("RecallStage.channel_lists called before load(artifact_dir)")
        return self._model.channel_lists(history, exclude, vector, self._popularity, self.depth)

    def more(self, request: Request, size: int) -> Iterator[np.ndarray]:
        """Candidates beyond ``run``'s depth, for a list the rules left short (``recsys.pipeline``
        backfill): the whole popularity channel, ``size`` items at a time, excluded items dropped."""
        if self._popularity is None:
            raise RuntimeError("RecallStage.more called before load(artifact_dir)")
        return self._popularity.blocks(np.unique(request.excluded), size)
