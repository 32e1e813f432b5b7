"""Benchmarks and probes: each measures one thing and returns a JSON-ready report.

Above ``serving`` and ``jobs`` in the layer order (it drives real servers and reuses the jobs'
training and candidate sources); ``recsys bench ...`` and ``recsys tag bench-logits`` write the
reports. Modules say what they measure: ``serving`` (the HTTP paths under a traffic mix),
``llm_path`` (the served LLM path, cold and warm prefix), ``soak`` (a long run's latency windows
and memory), ``recall_index`` (faiss ANN against exact search), ``llm_stage`` (the LLM stage's
precision, prefix cache and batching), ``llm_backbones`` (how much ranking signal a backbone
carries), ``tagging_logits`` (logit taggers against generation).
"""
