"""The data layer every stage reads: datasets in one schema, the split they are trained and judged
on, and the arithmetic of judging them.

- ``schema``: the canonical ``Dataset`` (interactions, items, users) every loader produces;
  ``loaders``: known directory layouts (ML-100K, CSV, Parquet, ...) and ``synthetic`` data;
- ``protocol``: k-core filtering and the leave-one-out split; ``split``: the saved ``Split``
  every trainer and evaluator loads;
- ``metrics``, ``baselines`` (the popularity baseline and the one evaluation entry point),
  ``bootstrap`` (paired confidence intervals);
- ``item_neighbours``: item-to-item neighbour models fitted from interaction sequences (recall's
  channels, coarse's channel features, the evaluation baselines);
- ``tag_store``: reading what the tagging job wrote.

Deliberately left out: anything that trains a model or serves a request (the stage packages
above, ``jobs``, ``serving``).
"""
