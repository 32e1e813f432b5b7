"""The one implementation of the score maths (``llm_rerank.verbalizer_scores``) against torch's own ops.

The local backend used ``torch.sigmoid`` / ``torch.log_softmax`` on float32 logits before the maths
moved to numpy; these references pin that the move changed no score beyond float32 rounding, and
that the local and HTTP backends (log-probabilities, not logits) give the same scores.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llm_rerank.forward import listwise_from_logits, pointwise_from_logits
from llm_rerank.verbalizer_scores import listwise_scores, pointwise_scores

SEEDS = range(5)


def _logits(seed: int, rows: int = 7, vocab: int = 40) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=g) * (1.0 + 4.0 * seed)  # margins up to ~60 nats


@pytest.mark.parametrize("seed", SEEDS)
def test_pointwise_equals_torch_sigmoid_of_the_margin(seed: int) -> None:
    logits = _logits(seed)
    got = pointwise_from_logits(logits, 3, 11)
    np.testing.assert_allclose(got, torch.sigmoid(logits[:, 3] - logits[:, 11]).numpy(), rtol=1e-6, atol=1e-7)
    assert got.dtype == np.float32


@pytest.mark.parametrize("seed", SEEDS)
def test_listwise_equals_torch_log_softmax_of_the_letters(seed: int) -> None:
    logits = _logits(seed, rows=1)
    letters = [5, 9, 2, 30, 17, 8, 1, 0, 39]
    for n in (1, 2, 5, 9):
        got = listwise_from_logits(logits, letters, n)
        np.testing.assert_allclose(got, torch.log_softmax(logits[0, letters[:n]], dim=-1).numpy(),
                                   rtol=1e-6, atol=2e-6)
        assert got.dtype == np.float32 and got.shape == (n,)


@pytest.mark.parametrize("seed", SEEDS)
def test_log_probabilities_give_the_scores_logits_give(seed: int) -> None:
    """The HTTP backend reads log-probabilities; the normaliser cancels in both maps."""
    logits = _logits(seed).double()
    logp = torch.log_softmax(logits, dim=-1).numpy()
    raw = logits.numpy()
    np.testing.assert_allclose(pointwise_scores(logp[:, 0], logp[:, 1]), pointwise_scores(raw[:, 0], raw[:, 1]),
                               rtol=1e-6)
    np.testing.assert_allclose(listwise_scores(logp[0, :6]), listwise_scores(raw[0, :6]), atol=1e-5)


def test_exact_values_and_extreme_margins() -> None:
    np.testing.assert_allclose(pointwise_scores([2.0, 0.0], [0.0, 1.0]),
                               [np.exp(2) / (np.exp(2) + 1), 1 / (1 + np.e)], rtol=1e-6)
    with np.errstate(over="raise"):  # no overflow however large the margin
        assert pointwise_scores([1000.0, -1000.0], [-1000.0, 1000.0]).tolist() == [1.0, 0.0]
        np.testing.assert_allclose(np.exp(listwise_scores([1000.0, 0.0, -1000.0])), [1.0, 0.0, 0.0])
    np.testing.assert_allclose(np.exp(listwise_scores([0.0, np.log(3.0)])), [0.25, 0.75], rtol=1e-6)
