"""Configuration of the recall stage (two-tower model, faiss index, popularity, co-visitation and
item-model channels).

Defaults are tuned on ML-100K (5-core, leave-one-out, full ranking) to train in a few
minutes on one CPU core; see ``recall.train`` for the measured figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_DEPTH = 200  # the recall stage's depth when its spec gives none
# with ``refit`` on, the early-stopped model's copy inside the served ``recall/`` directory: what the
# jobs that tune or measure on the valid phase load (the served model has learnt every valid item)
EARLY_STOPPED_DIR = "early_stopped"

# params of a ``recall_llm`` stage (recall.llm_channel) that are the LLM channel's, not RecallConfig keys
LLM_CHANNEL_PARAMS = ("llm_share", "llm_window")
# ``max_epochs: None`` bounds a fit at this many optimizer steps, in whole epochs and never under
# SCALED_MIN_EPOCHS: a bound on work that grows with the data, not a fixed epoch count sized to one
# dataset. Early-stopped fits used ~1.1k steps (ML-100K, 19 an epoch), ~2.8k (a 3,650-item MovieLens,
# 148 epochs) and ~1k (Amazon Scientific, 65 an epoch): the bound is an order of magnitude above.
SCALED_MAX_STEPS, SCALED_MIN_EPOCHS = 20_000, 200


class RecallConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # -- model --------------------------------------------------------------------------
    dim: int = Field(64, ge=8, le=1024, description="Embedding dimension of both towers.")
    max_len: int = Field(50, ge=1, le=1024, description="Most recent history items the user tower reads.")
    n_blocks: int = Field(2, ge=1, le=8, description="Causal self-attention blocks in the user tower.")
    n_heads: int = Field(2, ge=1, le=16, description="Attention heads per block; must divide dim.")
    dropout: float = Field(0.3, ge=0.0, lt=1.0, description="Dropout on embeddings, attention and FFN.")
    temperature: float = Field(
        0.05, gt=0.0, le=10.0, description="Score = cosine(user, item) / temperature in the training softmax."
    )
    use_text: bool = Field(True, description="Add projected MiniLM title/text embeddings to the item tower.")
    # Cold-item protocol on ML-100K (134 new items, results/eval/ml100k_cold_items.json): 0.2 lifts the
    # new-item slice's candidate recall@200 from 0.64 to 0.74 and its recall NDCG@10 from 0.014 to 0.044.
    id_dropout: float = Field(
        0.2, ge=0.0, lt=1.0, description="Training-time probability of dropping a known item's id embedding, so "
        "the content part (text, categories, year) learns to place an item alone, as it must for a new item."
    )
    # -- training -----------------------------------------------------------------------
    lr: float = Field(2e-3, gt=0.0, le=1.0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW decoupled weight decay.")
    batch_size: int = Field(128, ge=1, le=65_536, description="Training windows per step.")
    max_epochs: int | None = Field(
        None, ge=1, le=100_000, description="Upper bound on training epochs. None: scaled to the data, enough "
        f"epochs for {SCALED_MAX_STEPS:,} optimizer steps and at least {SCALED_MIN_EPOCHS} (``epoch_bound``); early "
        "stopping on the valid items ends a fit long before (converged fits take ~1-3k steps).")
    # 8, not 3: valid NDCG@10 (and the untruncated NDCG alike) plateaus for 4-5 evaluations
    # around epoch 22-30 on ML-100K and climbs again to epoch ~60; with 3 the seed-42 fit stopped at the
    # plateau (best epoch 22, test two-tower recall@200 0.792 against 0.82-0.83 from epoch 40 on).
    # 3 seeds (results/decisions/patience8_ml100k.json): candidate recall@200 0.8254 +- 0.0137
    # -> 0.8303 +- 0.0049, coarse NDCG@10 0.1213 -> 0.1221; two-tower training 196 -> 336 s per model.
    patience: int = Field(8, ge=1, le=1000, description="Evaluations without improvement before stopping.")
    eval_every: int = Field(2, ge=1, le=1000, description="Epochs between early-stopping evaluations.")
    # Auto: on where padding is most of the user tower's input (Amazon Scientific: median 6 items a user,
    # 90% of a 50-wide window padding; its steps ran ~2x faster), off where windows are mostly full
    # (ML-100K: 81% real), since sorting a pool by length makes batches less random; see
    # docs/decisions/0015-two-tower-converges.md.
    length_buckets: bool | None = Field(
        None, description="Batch training windows of similar length together and drop the columns a whole batch "
        "pads (recall.windows.epoch_batches): the user tower then runs over the real positions only, which is most "
        "of a step's cost on catalogs whose users have a handful of items. None: on when under half of the "
        "windows' positions are real (``uses_length_buckets``).")
    # 0 (every core): recall/__init__ sets OMP_WAIT_POLICY=PASSIVE, without which libgomp's workers
    # spin-wait on cores other jobs need and 2 threads run ~9x slower than 1. ML-100K, seed 42,
    # one run on an otherwise idle machine: 1 thread 155 s, 2 threads (passive) 117 s, same 22
    # epochs and the same NDCG; 2 threads with the default wait policy: 35 s vs 23 s for 4 epochs.
    train_threads: int = Field(
        0, ge=0, le=256, description="torch CPU threads for training; 0 = every available core, split in half "
        "between recall and recall_holdout, which are then fitted at once (jobs.train.fit_threads). A set count "
        "fits them one after the other on that many."
    )
    tune_users: int | None = Field(
        10_000, ge=1, description="Users whose held-out item early stopping and the channel-share search read "
        "(a seeded sample above this many, so their cost stops growing with users); None: every user."
    )
    # Opt-in: a fixed logit budget is sized to one dataset. At 1e10 (~77 epochs of ML-100K) it stopped a
    # 3,650-item MovieLens fit at epoch 31 with valid NDCG@10 still rising (converged: 148 epochs, test
    # NDCG@10 doubled). Early stopping under the scaled epoch bound ends every fit deterministically.
    max_train_logits: float | None = Field(
        None, gt=0, description="Opt-in deterministic training budget (None: none): logits the training softmax "
        "computes (target positions x items scored: the catalog under the full softmax, 1 + n_negatives under the "
        "sampled one), checked after every step (an epoch is cut short); the model is then evaluated and the best "
        "one so far kept, and the fit is reported as budget-stopped (not converged).")
    max_train_s: float | None = Field(
        None, gt=0, description="Opt-in wall-clock cap on training (None: none), checked after every step like the "
        "budget; when it, not the budget, stops a fit the result depends on the machine's speed and load (train and "
        "eval then print a warning). Off by default: the same seed and data give the same model on a busy machine.")
    mask_history: bool = Field(
        True, description="Leave the items a user had before each training target out of its softmax, as "
        "negatives (the served ranking excludes a user's history, so it never competes with them there); a "
        "repeat of an earlier item stays a target. On ML-100K, 3 seeds: two-tower NDCG@10 +0.014, "
        "candidate recall@200 +0.006.")
    # Off by default: on ML-100K (3 seeds, recall.train's module doc, Refit) it lifts candidate recall@200
    # +0.005 and coarse@50 +0.007 (every seed) but not the served coarse NDCG@10 (-0.0017 +- 0.0037).
    refit: bool = Field(
        False, description="After early stopping on the valid items, train the served two-tower again from scratch "
        "on each user's training sequence plus its valid item, for the best epoch count, and refit the extra "
        "channels on those sequences (their shares stay the ones gated on valid). The valid item is in every "
        "test-time history and the most recent thing a user did; without the refit no model ever learnt from it. "
        "The early-stopped model is kept in recall/early_stopped/ for the jobs that tune on the valid phase "
        "(fusion gate, LLM adaptation). Costs one more fit of at most the best epoch count.")
    loss: Literal["auto", "full", "sampled"] = Field(
        "auto", description="full softmax over the catalog, sampled softmax with logQ correction, or auto."
    )
    full_softmax_max_items: int = Field(
        50_000, ge=1, description="With loss=auto, catalogs up to this size use the full softmax."
    )
    n_negatives: int = Field(1024, ge=1, le=1_000_000, description="Shared negatives per step (sampled loss).")
    # -- serving ------------------------------------------------------------------------
    index: Literal["flat", "ivf", "hnsw"] = Field("flat", description="faiss index kind; flat is exact.")
    merge_order: Literal["interleave", "priority"] = Field(
        "priority",
        description="How channel lists merge: 'priority' keeps the two-tower order on top and appends the "
        "popularity quota after it; 'interleave' deals slots Sainte-Lague style (popularity every ~10th slot).",
    )
    popularity_share: float = Field(
        0.1, ge=0.0, le=1.0, description="Share of the recall depth filled from the popularity channel."
    )
    cold_popularity_share: float = Field(
        0.8, ge=0.0, le=1.0, description="Popularity share for a user with an empty history."
    )

    # -- extra channels, on by default. Measured on ML-100K over 3 paired seeds (with
    # coarse.channel_features): coarse NDCG@10 0.1059 +- 0.0037 -> 0.1158 +- 0.0021, positive on every
    # seed (results/decisions/channels_*_ml100k.json). Switch one off with covisit_channel: false / item_model: off.
    covisit_channel: bool = Field(
        True, description="Add the co-visitation channel (offline.item_neighbours.covisitation) beside the two-tower."
    )
    covisit_window: int = Field(10, ge=1, le=50, description="Co-visitation pairs are at most this many steps apart.")
    covisit_backward: float = Field(
        0.5, ge=0.0, le=1.0, description="Weight of a pair where the neighbour came before the item (forward = 1)."
    )
    covisit_last_n: int = Field(10, ge=1, le=200, description="Most recent history items the co-visitation query reads.")
    item_model: Literal["off", "ease", "knn"] = Field(
        "ease", description="Add an item-model channel: EASE (dense, up to ease_max_items items, item-kNN beyond) "
        "or item-kNN (cosine, top-k neighbours per item)."
    )
    item_model_last_n: int = Field(
        50, ge=1, le=10_000, description="Most recent history items the item-model query reads (recency-decayed)."
    )
    ease_l2: float = Field(500.0, gt=0.0, description="EASE L2 penalty on the item-item weights.")
    ease_max_items: int = Field(
        10_000, ge=1, le=50_000, description="Largest catalog fitted with the dense EASE inverse (4 n^2 bytes, twice)."
    )
    knn_shrink: float = Field(10.0, ge=0.0, description="Shrink term in the item-kNN cosine denominator.")
    neighbours: int = Field(
        200, ge=1, le=10_000, description="Entries kept per item row of the co-visitation and item-model matrices."
    )
    channel_shares: dict[str, float] | None = Field(
        None, description="Share of the depth per extra channel, e.g. {covisit: 0.2}; None = the shares gated "
        "on valid at training time (saved in recall/channels.json)."
    )

    @property
    def extra_channels(self) -> tuple[str, ...]:
        """Names of the extra channels this config turns on, in merge order after the two-tower."""
        return (*(("covisit",) if self.covisit_channel else ()), *(("item_model",) if self.item_model != "off" else ()))

    @model_validator(mode="after")
    def _check(self) -> RecallConfig:
        if self.dim % self.n_heads:
            raise ValueError(f"recall.dim ({self.dim}) must be divisible by recall.n_heads ({self.n_heads})")
        shares = self.channel_shares or {}
        if bad := {k: v for k, v in shares.items() if k not in ("covisit", "item_model") or not 0.0 <= v <= 1.0}:
            raise ValueError(f"recall.channel_shares: unknown channel or share outside [0, 1]: {bad}")
        if sum(shares.values()) + self.popularity_share > 1.0:
            raise ValueError(f"recall.channel_shares {shares} plus popularity_share {self.popularity_share} exceed 1")
        return self

    def for_stage(self, kind: str, params: Mapping[str, Any]) -> RecallConfig:
        """This config with a recall stage's ``params`` on top (validated, unknown keys refused), as the
        stage serves it and training must fit it; a ``recall_llm`` stage's own keys are left out."""
        own = {k: v for k, v in params.items() if not (kind == "recall_llm" and k in LLM_CHANNEL_PARAMS)}
        return RecallConfig.model_validate({**self.model_dump(), **own}) if own else self

    def epoch_bound(self, steps_per_epoch: int) -> tuple[int, str]:
        """The most epochs a fit may train and why (``max_epochs``, or scaled to ``steps_per_epoch``).

        >>> RecallConfig().epoch_bound(19)
        (1053, 'scaled: 20,000 steps / 19 steps per epoch, at least 200')
        """
        if self.max_epochs is not None:
            return self.max_epochs, "recall.max_epochs"
        bound = max(SCALED_MIN_EPOCHS, -(-SCALED_MAX_STEPS // max(steps_per_epoch, 1)))
        return bound, (f"scaled: {SCALED_MAX_STEPS:,} steps / {steps_per_epoch} steps per epoch, "
                       f"at least {SCALED_MIN_EPOCHS}")

    def uses_length_buckets(self, real_share: float) -> tuple[bool, str]:
        """Whether an epoch's batches are length-bucketed and why, given the share of the training
        windows' positions that are real items rather than padding.

        >>> RecallConfig().uses_length_buckets(0.1)
        (True, 'auto: 10% of window positions are real, under 50%')
        """
        if self.length_buckets is not None:
            return self.length_buckets, "recall.length_buckets"
        on = real_share < 0.5
        return on, f"auto: {real_share:.0%} of window positions are real, {'under' if on else 'at least'} 50%"

    def uses_full_softmax(self, n_items: int) -> bool:
        """Whether training scores every catalog item (cheap below ~50k items, and the better loss)."""
        if self.loss == "auto":
            return n_items <= self.full_softmax_max_items
        return self.loss == "full"
