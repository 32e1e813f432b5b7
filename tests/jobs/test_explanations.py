"""The explanation benchmark and the precompute job on the toy catalog, with the real LLM stage over a
tiny random model and a real embedded Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from cascade.registry import STAGE_KINDS
from cascade.settings import ENV_REDIS_URL, Settings
from jobs.explanations import precompute_reasons
from recsys.redis_server import EmbeddedRedis
from serving.online_backend import OnlineBackend
from serving.schemas import RecommendRequest
from serving.service import Recommender
from tests.llm_rerank.factories import save_tiny_llm
from tests.serving.toy import TOY_KINDS, save_toy_split

STAGES = [{"name": "recall", "kind": "recall", "on_error": "fail"}, {"name": "llm", "kind": "llm", "depth": 20},
          {"name": "rules", "kind": "rules", "on_error": "fail"}]


@pytest.fixture
def redis_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    server = EmbeddedRedis(tmp_path / "redis")
    url = server.start()
    monkeypatch.setenv(ENV_REDIS_URL, url)
    yield url
    server.close()


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Settings, Path]:
    """The toy catalog with toy recall and rules around the real LLM stage (tiny model)."""
    for kind in ("recall", "rules"):
        monkeypatch.setitem(STAGE_KINDS, kind, TOY_KINDS[kind])
    art = tmp_path / "toy"
    save_toy_split(art)
    llm = save_tiny_llm(tmp_path / "tiny-llm")
    settings = Settings.build({"pipeline": {"max_k": 5, "stages": STAGES},
                               "llm": {"model": str(llm), "precision": "fp32", "candidates": 5,
                                       "explain": {"model": "pipeline"}}})
    return settings, art


def test_precomputed_reasons_are_served_from_the_cache(toy: tuple[Settings, Path], redis_url: str) -> None:
    settings, art = toy
    report = precompute_reasons(settings, art, users=["u1", "u2"], k=3, explain_k=2)
    assert report["users"] == 2 and report["reasons"] == 4 and report["already_cached"] == 0
    assert len(redis.Redis.from_url(redis_url).keys(f"{art.name}:reason:*")) == 4
    backend = OnlineBackend.open(settings, art)
    try:
        rec = Recommender.load(settings, art, backend=backend)
        rec.respond(RecommendRequest(user_id="u1", k=3, explain=True, explain_k=2), log_impressions=False)
        assert rec.explanations.writer(rec.online).counts["cached"] == 2
    finally:
        backend.close()
