from __future__ import annotations

import pytest

from recsys.experiments import user_hash
from serving.policy import choose_route, llm_bucket, result_cache_key


def test_llm_bucket_is_deterministic_and_salted() -> None:
    assert llm_bucket("user-42", "a") == llm_bucket("user-42", "a")
    assert llm_bucket("user-42", "a") != llm_bucket("user-42", "b")


def test_llm_share_and_experiments_place_users_with_one_hash() -> None:
    assert llm_bucket("user-42", "salt") == user_hash("salt", "user-42") / 2.0**64


@pytest.mark.parametrize("share", [0.0, 0.05, 0.3, 0.5, 1.0])
def test_llm_share_on_10k_ids_is_close_to_configured(share: float) -> None:
    routes = [choose_route(f"user-{i}", None, share, "salt", llm_available=True) for i in range(10_000)]
    got = sum(r.llm for r in routes) / len(routes)
    # binomial sd at p=0.5, n=10k is 0.005: 0.015 is three of them
    assert abs(got - share) <= 0.015
    again = [choose_route(f"user-{i}", None, share, "salt", llm_available=True) for i in range(10_000)]
    assert again == routes


def test_opt_in_and_out_and_unavailable_llm() -> None:
    assert choose_route("u", False, 1.0, "s", llm_available=True).reason == "opt_out"
    assert choose_route("u", True, 0.0, "s", llm_available=True).reason == "opt_in"
    assert choose_route("u", True, 1.0, "s", llm_available=False).llm is False
    assert choose_route("u", None, 0.0, "s", llm_available=True).reason == "not_in_share"
    with pytest.raises(ValueError, match="llm_share"):
        choose_route("u", None, 1.5, "s", llm_available=True)


def test_result_cache_key_changes_with_everything_the_answer_depends_on() -> None:
    base = dict(user_id="u1", k=5, context={"a": 1, "b": 2}, history_version=3,
                versions={"rules": "v1", "recall": "r"}, llm=False)
    key = result_cache_key(**base)  # type: ignore[arg-type]
    assert key == result_cache_key(**{**base, "context": {"b": 2, "a": 1}})  # type: ignore[arg-type]
    for change in ({"user_id": "u2"}, {"k": 6}, {"context": {"a": 2}}, {"history_version": 4},
                   {"versions": {"rules": "v2", "recall": "r"}}, {"llm": True}):
        assert result_cache_key(**{**base, **change}) != key  # type: ignore[arg-type]
