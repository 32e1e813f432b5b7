"""Configuration of the LightGBM LambdaRank coarse ranker.

Two groups of fields: the booster's hyper-parameters (tuned defaults for ~1k query groups of
~200 candidates, where a small, strongly regularised forest generalises best) and the
feature builder's knobs (co-occurrence window, recency half-life, attribute smoothing).
The seed is not here: trainers take the root ``Settings.seed``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_SUBDIR = "coarse"
# Bumped when a fix changes what the coarse ranker learns from under the same settings; it is part of
# the stage's config id (cascade.registry.config_id, jobs.coarse_tags.tags_source), so `recsys train`
# retrains models trained before it. Revision 2: train groups are recalled without their labels in the
# popularity counts (jobs.train.holdout_recall).
TRAINING_REVISION = 2


class CoarseConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # -- LightGBM LambdaRank ----------------------------------------------------------
    num_leaves: int = Field(default=31, ge=2, le=1024, description="Leaves per tree.")
    learning_rate: float = Field(default=0.05, gt=0, le=1, description="Shrinkage per boosting round.")
    n_estimators: int = Field(default=300, ge=1, le=10_000, description="Upper bound on boosting rounds.")
    min_child_samples: int = Field(default=50, ge=1, le=100_000, description="Minimum rows per leaf.")
    feature_fraction: float = Field(default=0.8, gt=0, le=1, description="Share of features sampled per tree.")
    bagging_fraction: float = Field(default=0.8, gt=0, le=1, description="Share of rows sampled per tree.")
    reg_lambda: float = Field(default=1.0, ge=0, description="L2 penalty on leaf values.")
    early_stopping_rounds: int = Field(default=30, ge=1, le=1000, description="Stop after this many rounds without valid gain.")
    eval_at: int = Field(default=10, ge=1, le=1000, description="k of the NDCG@k early stopping watches.")
    truncation_level: int = Field(
        default=30, ge=1, le=10_000, description="LambdaRank pairs are formed only with the top-N of each query."
    )
    num_threads: int = Field(default=2, ge=1, le=256, description="LightGBM threads for training and scoring.")
    ensemble: int = Field(
        default=3, ge=1, le=10,
        description="LambdaRank fits whose scores are averaged into the served one: the chosen setting fitted "
        "at seeds seed, seed+1, ... Fits that differ only in their row and column samples disagree by more than "
        "most settings do; their mean ranks about as well as the luckiest and narrows the spread over seeds. "
        "1: one fit.",
    )
    train_positions: int = Field(
        default=3, ge=1, le=20,
        description="Train queries per user: each of the last N training items as a label, given the items "
        "before it. Candidates must come from a recall model trained without those N items "
        "(artifacts recall_holdout/), so no label was seen in training.",
    )
    # Samples keep training cost and memory flat past 10K users on one machine (each query group is ~200
    # feature rows: 125K users x 3 positions would be 75M rows); ML-100K/ML-1M have fewer users and use
    # them all. On a Ray cluster (settings.ray) the rows spread over the workers, so null is the way to
    # train on every user there.
    max_train_users: int | None = Field(
        default=10_000, ge=1, description="Users giving training query groups: a seeded sample of this many "
        "when there are more, which the training report states (user_sample.train: 'sampled 10,000 of 24,998 "
        "users (coarse.max_train_users)'); None uses all."
    )
    max_valid_users: int | None = Field(
        default=10_000, ge=1, description="Users giving early-stopping (valid) query groups: a seeded sample of "
        "this many when there are more, stated in the report (user_sample.valid); None uses all."
    )
    # -- features ---------------------------------------------------------------------
    cooc_window: int = Field(
        default=3, ge=1, le=50, description="Item b co-occurs after a when it follows a within this many steps."
    )
    last_n: int = Field(default=5, ge=1, le=50, description="How many recent history items the similarity features use.")
    recency_half_life_days: float = Field(
        default=30.0, gt=0, description="Half-life of the exponential decay in recency-weighted popularity."
    )
    attribute_prior: float = Field(
        default=20.0, ge=0, description="Pseudo-count shrinking per-segment item shares and mean ratings toward the global value."
    )
    tag_features: bool = Field(
        default=False,
        description="Add the LLM tag features (coarse_rank.features.TAG_FEATURES: LLM genre/theme affinity with "
        "the history, risk flags, LLM-embedding cosine with the recent history). Training then needs the "
        "item tags (jobs.coarse_tags.train_coarse_tags writes such a model to <artifact_dir>/coarse_tags).",
    )
    llm_embedding_features: Literal["auto"] | bool = Field(
        default="auto",
        description="Add coarse_rank.llm_features.LLM_EMBEDDING_FEATURES (cosine of a candidate's LLM item "
        "embedding with the mean of the last last_n history items', and the max over them), computed from "
        "<artifact_dir>/tags/hidden.npy (`recsys tag --method embed`) projected without the train labels "
        "(jobs.tagging.embed.coarse_item_embeddings). true = always (training fails without the embeddings); "
        "false = never; 'auto' = off without the embeddings, else the ranker is fitted without and with them on "
        "the same query groups and the fit with them is served only when it beats the other on the valid groups "
        "beyond its paired CI (coarse_rank.llm_gate); the training report says which and why.",
    )
    item_age_features: bool = Field(
        default=True,
        description="Add coarse_rank.item_age.ITEM_AGE_FEATURES: how long before the newest interaction an item "
        "was first seen and the share of its interactions that are recent, both relative to the log, so a young "
        "item people pick now is told apart from an old one with the same count.",
    )
    channel_features: bool = Field(
        default=True,
        description="Add coarse_rank.channel_features.CHANNEL_FEATURES (co-visitation and item-model scores of "
        "every candidate, fitted on the builder's interactions) and one rank_<channel> column per recall channel.",
    )
    # Both chosen on valid by default (coarse_rank.cold_training.cold_item_variants): on the ML-100K cold-item protocol a
    # dropout of 0.1 lifts the new-item slice's coarse NDCG@10 but costs the warm slice far more; young copies cost
    # the warm slice nothing and lift the new items a little (docs/decisions/0020-young-item-copies.md).
    cold_item_dropout: float | None = Field(
        default=None, ge=0, lt=1, description="Share of items whose interaction features (features."
        "INTERACTION_FEATURES) are hidden in training, as they are for a new item at serving, so the ranker learns "
        "to order new items by their recall score and content. 0 = off; null = chosen on the valid groups among "
        "coarse_rank.cold_training.COLD_ITEM_DROPOUTS with the young copies, served over none only beyond its paired CI "
        "(coarse_rank.cold_training.cold_item_variants, coarse_rank.gates.choose_dropout).")
    young_item_copies: float | None = Field(
        default=None, ge=0, lt=1, description="Share of the youngest known items (first seen last) whose "
        "interaction features are hidden in an added copy of every train group holding one, the original rows "
        "kept: the ranker learns how often an item without evidence is the one picked, as a new item is at "
        "serving, without losing what warm items teach. 0 = off; null = chosen on the valid groups among "
        "coarse_rank.cold_training.YOUNG_ITEM_COPIES with the dropouts (coarse_rank.cold_training.cold_item_variants).")
    new_items: Literal["auto", "recall_place", "model"] = Field(
        default="auto", description="Where an item the fitted tables hold no interaction of goes: 'recall_place' = "
        "the position recall ranked it at among the request's candidates, the known items keeping the ranker's "
        "order (coarse_rank.new_items); 'model' = where the ranker's score puts it (below items with evidence); "
        "'auto' = whichever training chose on the valid groups (recall_place only beyond its paired CI). Changes "
        "nothing on a request without such an item.")
    channel_window: int = Field(default=10, ge=1, le=50, description="Co-visitation window of the channel features.")
    channel_last_n: int = Field(default=10, ge=1, le=200, description="Recent items the co-visitation feature reads.")
    item_model_last_n: int = Field(default=50, ge=1, le=10_000, description="Recent items the item-model feature reads.")

    @model_validator(mode="after")
    def _check(self) -> CoarseConfig:
        if self.truncation_level < self.eval_at:
            raise ValueError(
                f"coarse.truncation_level ({self.truncation_level}) must be >= coarse.eval_at ({self.eval_at}):"
                " LambdaRank would ignore pairs the metric counts"
            )
        return self


def stage_subdir(stage: str, params: dict[str, Any]) -> str:
    """The trained copy a coarse stage's ``params`` select (``subdir``, default ``coarse``); anything
    else in them is refused by name (checked when the config loads and when the stage is built)."""
    subdir = params.get("subdir", DEFAULT_SUBDIR)
    if set(params) - {"subdir"} or not isinstance(subdir, str) or not subdir or Path(subdir).name != subdir:
        raise ValueError(f"stage {stage!r}: params must be at most {{subdir: <directory name>}}, got {params}")
    return subdir


def served_placement(setting: str, chosen: str | None) -> str:
    """The new-item placement a coarse stage serves: the setting, or with ``auto`` what training chose
    (``model`` for a ranker trained before the choice existed).

    >>> served_placement("auto", "recall_place"), served_placement("auto", None), served_placement("model", "recall_place")
    ('recall_place', 'model', 'model')
    """
    return (chosen or "model") if setting == "auto" else setting
