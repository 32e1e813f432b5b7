"""The served top-50 of every user of the tiny trained cascade equals the one computed with the
stages' reference (unoptimised) arithmetic, and the deadline-bounded calls change no ranking.

The references: the neighbour channels' scores as the sparse product ``query @ W`` (scipy), the
coarse follow counts as scipy's slice ``follow[rows][:, cols]``. The served code computes both
without building sparse matrices per request; any difference in a single float would move items.
"""

from __future__ import annotations

import numpy as np
import pytest

from coarse_rank import features
from offline.item_neighbours import NeighbourChannel
from recsys.pipeline import Pipeline
from serving.schemas import RecommendRequest
from serving.service import Recommender

K = 50


def reference_scores(channel: NeighbourChannel, history: np.ndarray) -> np.ndarray:
    return (channel.query(history) @ channel.weights).toarray().ravel().astype(np.float32)


def reference_block(mat, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    return mat[rows][:, cols].toarray()


def without_budgets(pipeline: Pipeline) -> None:
    pipeline.stages = [(spec.model_copy(update={"budget_ms": None}), stage) for spec, stage in pipeline.stages]
    pipeline.request_budget_ms = None


def served(recommender: Recommender) -> dict[str, tuple[list[int], list[float]]]:
    out = {}
    for user in [*recommender.catalog.user_index, *sorted(recommender.catalog.outside), "nobody-knows-me"]:
        request = recommender.catalog.request_for(user, K)
        result = recommender.pipeline.run(request, skip=recommender.llm_stages)
        assert result.fallbacks == [], (user, result.traces)
        cands = result.candidates
        items = cands.items.tolist()
        assert len(items) == len(set(items)) and len(items) + result.short_by == K  # no repeats, shortfall said
        assert not set(items) & set(np.asarray(request.excluded).tolist())  # nothing the user already has
        out[user] = (items, cands.score(cands.order_by).tolist())
    return out


@pytest.fixture(scope="module")
def recommender(tiny_cascade) -> Recommender:
    art, settings = tiny_cascade
    rec = Recommender.load(settings, art)
    without_budgets(rec.pipeline)
    return rec


def test_served_top50_equals_the_reference_arithmetic(recommender, monkeypatch):
    fast = served(recommender)
    assert sum(len(items) for items, _ in fast.values()) > 0
    monkeypatch.setattr(NeighbourChannel, "scores", reference_scores)
    monkeypatch.setattr(features, "_dense_block", reference_block)
    reference = served(recommender)
    assert fast.keys() == reference.keys()
    differ = [u for u in fast if fast[u][0] != reference[u][0]
              or not np.array_equal(fast[u][1], reference[u][1], equal_nan=True)]
    assert differ == [], f"{len(differ)} of {len(fast)} users ranked differently, e.g. {differ[:3]}"


def test_the_deadline_bounded_calls_answer_what_the_direct_calls_answer(tiny_cascade, recommender):
    art, settings = tiny_cascade
    bounded = Recommender.load(settings, art, pipeline=recommender.pipeline)  # same loaded stages
    bounded.pipeline = Pipeline([(spec.model_copy(update={"budget_ms": 60_000.0}) if spec.budget_ms is not None
                                  else spec, stage) for spec, stage in recommender.pipeline.stages],
                                request_budget_ms=120_000.0)
    for user in list(recommender.catalog.user_index)[:20]:
        answer = bounded.respond(RecommendRequest(user_id=user, k=K, llm=False))
        assert answer.fallbacks == [] and answer.path == "light"
        request = recommender.catalog.request_for(user, K)
        direct = recommender.pipeline.run(request, skip=recommender.llm_stages).candidates.items
        assert [item.id for item in answer.items] == [recommender.catalog.item_id(int(i)) for i in direct]
