"""Slice tables of the evaluator (jobs.evaluation.cascade_run)."""

import numpy as np

from jobs.evaluation.cascade_run import slice_table


def test_a_one_user_slice_has_its_metrics_and_no_deltas():
    # a slice (cold items, short histories) can hold one user on a small dataset: it used to stop eval
    # after training with scipy's "each sample in `data` must contain two or more observations"
    tops = {"recall": np.array([[3, 1, 2]]), "coarse": np.array([[1, 3, 2]])}
    one = slice_table(tops, np.array([1]), ["recall", "coarse"], n_boot=50)
    assert one["users"] == 1 and one["deltas"] == {}
    assert one["stages"]["coarse"]["recall@10"] == 1.0 and one["stages"]["coarse"]["ndcg@10"] == 1.0
    two = slice_table({s: np.vstack([t, t]) for s, t in tops.items()}, np.array([1, 2]), ["recall", "coarse"],
                      n_boot=50)
    assert set(two["deltas"]) == {"coarse_vs_recall"}
