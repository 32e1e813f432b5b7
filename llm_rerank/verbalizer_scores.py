"""Candidate scores from the answer position's verbalizer values: the one implementation (numpy).

Both backends end here: the local one (``llm_rerank.forward`` gathers the verbalizer logits from
its torch tensor) and the HTTP one (``llm_rerank.remote`` reads them as log-probabilities from
the server's JSON). Logits and log-probabilities give the same scores, because both maps below
only look at differences between values of one row (the softmax normaliser cancels).

- pointwise (TALLRec, Bao et al. 2023): ``P(Yes) / (P(Yes) + P(No)) = sigmoid(yes - no)``.
- listwise (LlamaRec, Yue et al. 2023): log-softmax over the candidates' letters.
- ``zscore``: the residual term of listwise adaptation and serving (``AdaptConfig.residual``).

Everything is computed in float64 and returned as float32; the torch path's float32 ops agree
to about 1e-7 (``tests/llm_rerank/test_verbalizer_scores.py``).

Deliberately left out: gathering the verbalizer values (each backend's own business) and losses
for training (``llm_rerank.adapt`` keeps those in torch, for the gradients).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def pointwise_scores(yes: ArrayLike, no: ArrayLike) -> np.ndarray:
    """``sigmoid(yes - no)`` per row, without overflow for large margins.

    >>> pointwise_scores([2.0, 0.0], [2.0, np.log(3.0)]).tolist()
    [0.5, 0.25]
    """
    d = np.asarray(yes, dtype=np.float64) - np.asarray(no, dtype=np.float64)
    e = np.exp(-np.abs(d))
    return np.where(d >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(np.float32)


def listwise_scores(letters: ArrayLike) -> np.ndarray:
    """Log-softmax over the letter values of one request (candidate A first).

    >>> np.exp(listwise_scores([0.0, np.log(3.0)])).round(6).tolist()
    [0.25, 0.75]
    """
    lp = np.asarray(letters, dtype=np.float64)
    lp = lp - lp.max()
    return (lp - np.log(np.exp(lp).sum())).astype(np.float32)


def zscore(scores: ArrayLike) -> np.ndarray:
    """Per-request standardised scores (float32; NaN -> the lowest score; constant -> zeros).

    The residual term of listwise training and serving (``AdaptConfig.residual``, ``llm_rerank.adapt``): it makes the
    coarse margin comparable across requests whatever its scale.
    """
    s = np.asarray(scores, dtype=np.float64)
    if len(s) == 0:
        return s.astype(np.float32)
    finite = np.isfinite(s)
    if not finite.any():
        return np.zeros(len(s), dtype=np.float32)
    s = np.where(finite, s, s[finite].min())
    std = s.std()
    return ((s - s.mean()) / std if std > 1e-12 else np.zeros_like(s)).astype(np.float32)
