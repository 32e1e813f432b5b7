"""The coarse ranker's feature names and what each means (``coarse_rank.features`` builds them).

Kept apart from the builder so a reader, the trainer and the tests can name features without
the lookup tables: ``FEATURES`` (always), ``TAG_FEATURES`` (with ``CoarseConfig.tag_features``),
the interaction features a new item leaves unknown, and the categorical codes.
"""

from __future__ import annotations

FEATURES: dict[str, str] = {
    "recall": "recall stage score (NaN when recall did not score the item)",
    "recall_rank": "0-based position in the recall order (by the 'recall' score, NaN last)",
    "recall_gap": "recall score minus the request's best recall score",
    "item_log_pop": "log(1 + training interactions of the item)",
    "item_recent_pop": "log(1 + interactions decayed by the recency half-life, relative to the latest one)",
    "item_year": "release year (NaN unknown)",
    "item_audience": "audience code: index in offline.schema.AUDIENCES (NaN unknown)",
    "item_mean_rating": "mean rating shrunk toward the global mean by attribute_prior pseudo-ratings",
    "item_n_categories": "number of categories of the item",
    "hist_len": "length of the request history",
    "cat_affinity_max": "max over the item's categories of the share of history items in that category",
    "cat_affinity_mean": "mean of the same shares (NaN for an item without categories)",
    "follow_last": "times the item followed the last history item within cooc_window steps in training",
    "follow_last_norm": "follow_last / all followers of the last history item (P(item next | last))",
    "follow_recent_sum": "sum of follow counts from each of the last_n history items",
    "follow_recent_max": "max of those counts",
    "precede_last": "times the last history item followed this item (reverse direction)",
    "user_age": "user age in years (NaN unknown)",
    "user_gender": "gender code in the fitted vocabulary (NaN unknown)",
    "user_occupation": "occupation code in the fitted vocabulary (NaN unknown)",
    "age_item_lift": "item's share among users of the user's age bracket / its overall share",
    "gender_item_lift": "same for the user's gender",
    "occupation_item_lift": "same for the user's occupation",
}

# Only with CoarseConfig.tag_features. "Known history" = history items whose tags are not a
# fallback; NaN = unknown (fallback candidate, or no known history item).
TAG_FEATURES: dict[str, str] = {
    "tag_genre_affinity_max": "max over the item's LLM genres of the share of known history items with that genre",
    "tag_genre_affinity_mean": "mean of the same shares over the item's LLM genres",
    "tag_theme_affinity_max": "same as tag_genre_affinity_max for the LLM themes",
    "tag_theme_affinity_mean": "same as tag_genre_affinity_mean for the LLM themes",
    "tag_n_risk_flags": "number of LLM risk flags of the item",
    "tag_risk_excess": "tag_n_risk_flags minus the mean number of risk flags of the known history items",
    "llm_cos_last": "cosine of the item's LLM embedding with the last history item's (NaN without history)",
    "llm_cos_recent": "cosine with the normalised mean embedding of the last last_n history items",
}

# Features computed from the candidate's own interactions. For an item the fitted table holds
# no interaction of (a new item), they are unknown, not zero: ``transform`` writes NaN, and
# training masks them for a random share of items (``CoarseConfig.cold_item_dropout``) so the
# ranker learns to order such items by what they have (recall score, content, categories).
INTERACTION_FEATURES = (
    "item_log_pop", "item_recent_pop", "item_mean_rating", "follow_last", "follow_last_norm", "follow_recent_sum",
    "follow_recent_max", "precede_last", "age_item_lift", "gender_item_lift", "occupation_item_lift",
    "covisit_recent", "covisit_recent_rel", "item_model_score", "item_model_rel", "item_age", "item_recent_share",
)

# codes without an order: LightGBM splits them as categories, not thresholds
CATEGORICAL_FEATURES = ("item_audience", "user_gender", "user_occupation")
