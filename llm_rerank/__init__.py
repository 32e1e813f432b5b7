"""LLM re-ranker: prompt layout, logit scoring, adaptation, serving backends."""
