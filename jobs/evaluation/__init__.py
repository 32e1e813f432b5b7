"""Offline evaluation of a trained cascade: what each stage hands on and how it ranks.

``evaluate`` (the ``recsys eval`` report: per-stage metrics, deltas with paired CIs, policy costs)
over ``cascade_run`` (the cascade run over many requests); ``seeds`` (the same across seeds, mean and
sd); ``cold_items`` and ``cold_sources`` (the new-item slice, and which item knowledge reaches it);
``baselines`` (non-personal references); ``battery`` (the defaults over unlike dataset shapes);
``llm_rerank_eval`` (re-ranker variants against coarse's order) over ``llm_cases`` (the LLM stage's
requests and candidates); ``eval_summary`` and ``fit_report`` (what a report says to its reader).
"""
