"""``jobs.evaluation.evaluate`` helpers checked by hand, without a trained cascade (the whole report: ``tests/jobs/test_train.py``;
the one-user refusal: ``tests/cli/test_cli.py``)."""

from __future__ import annotations

import numpy as np

from cascade.settings import Settings
from jobs.evaluation.evaluate import stage_candidate_recall


def _run() -> dict:
    """Three requests through the default pipeline (recall 200 -> coarse 50 -> llm, disabled): a skipped
    stage is still shown what it passed on, so ``llm`` holds coarse's lists."""
    lists = {"recall": [[1, 2], [3, 4], [5]], "coarse": [[1], [4], [6]]}
    lists["llm"] = lists["coarse"]
    return {"status": {"recall": {"ok": 3}, "coarse": {"ok": 2, "fallback": 1}, "llm": {"skipped": 3}},
            "candidates": {s: [np.array(c, dtype=np.int64) for c in v] for s, v in lists.items()}}


def test_candidate_recall_names_each_depth_and_leaves_out_a_stage_that_never_ran() -> None:
    settings, targets = Settings.build({}), np.array([2, 4, 5])
    assert stage_candidate_recall(settings, _run(), targets) == {"recall@200": 1.0, "coarse@50": 0.33333}
    assert stage_candidate_recall(settings, _run(), targets, np.array([0, 1])) == {"recall@200": 1.0, "coarse@50": 0.5}
    assert stage_candidate_recall(settings, _run(), targets, np.zeros(0, np.int64)) == {"recall@200": 0.0,
                                                                                       "coarse@50": 0.0}
    on = {"status": {**_run()["status"], "llm": {"ok": 3}}}
    assert stage_candidate_recall(settings, {**_run(), **on}, targets)["llm@20"] == 0.33333

