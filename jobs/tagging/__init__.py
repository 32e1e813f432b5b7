"""Offline LLM tagging of the item catalog: grammar-constrained JSON tags, LoRA
adaptation on known attributes, pooled-hidden-state embeddings with a contrastive projection,
and the wiring of both into rules and recall.

Modules: ``schema`` (tag JSON schema), ``prompt``, ``generate`` (per-batch tagger), ``job``
(resumable chunks), ``ray_engine``, ``run`` (entry points), ``adapt``, ``embed``, ``quality``,
``wiring``, ``ablation``; tagging by label logits: ``label_prompt`` (token layout and
value probabilities), ``calibrate`` (thresholds), ``logits`` (the tagger; ``bench.tagging_logits`` compares it with the
generation path in one run). Nothing is imported here: each module imports its heavy libraries
(torch, transformers, xgrammar, ray, faiss) inside functions.
"""
