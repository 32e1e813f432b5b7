import numpy as np
import pytest

from recsys.contract import Candidates, Request


def make() -> Candidates:
    return Candidates(
        items=np.array([10, 11, 12, 13]),
        scores={"recall": np.array([0.4, 0.9, np.nan, 0.1], dtype=np.float32)},
        flags={"src_pop": np.array([True, False, False, True])},
    )


def test_sorted_by_is_descending_stable_with_nan_last():
    c = make().sorted_by("recall")
    assert c.items.tolist() == [11, 10, 13, 12]
    assert c.flags["src_pop"].tolist() == [False, True, True, False]
    assert c.order_by == "recall"


def test_with_scores_keeps_columns_aligned_and_input_untouched():
    c = make()
    out = c.with_scores("coarse", np.array([1, 3, 2, 0]))
    assert out.items.tolist() == [11, 12, 10, 13]
    assert out.score("recall")[0] == pytest.approx(0.9)
    assert "coarse" not in c.scores  # input not mutated
    assert np.isnan(out.score("llm")).all()


def test_length_mismatch_is_refused_with_the_column_name():
    with pytest.raises(ValueError, match="scores\\['recall'\\]"):
        Candidates(items=np.array([1, 2]), scores={"recall": np.array([0.1])})
    with pytest.raises(ValueError, match="'coarse'"):
        make().with_scores("coarse", np.zeros(3))


def test_head_and_take_by_mask():
    c = make()
    assert c.head(2).items.tolist() == [10, 11]
    assert c.head(99).items.tolist() == [10, 11, 12, 13]
    assert c.take(np.array([True, False, True, False])).items.tolist() == [10, 12]


def test_request_validates_k_and_defaults_exclusion_to_history():
    with pytest.raises(ValueError, match="k must be >= 1"):
        Request(user_id="u", k=0)
    r = Request(user_id="u", history=[3, 4])
    assert r.excluded.tolist() == [3, 4]
    assert r.remaining_s() == float("inf")
    assert Request(user_id="u", history=[3], exclude=[9]).excluded.tolist() == [9]
