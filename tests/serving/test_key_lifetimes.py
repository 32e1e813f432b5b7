"""Every key serving writes either expires or is bounded by the catalog, and anonymous users' state goes in hours.

The embedded Redis evicts only keys with a TTL (``volatile-lru``); what lives without one must
be either what may never be evicted (rule and prompt versions, the event stream and its
counters) or bounded by the catalog (the histories of the users it knows).
"""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from cascade.serving_config import ServingConfig

# what may live without a TTL: versions, the stream and its counters, the histories of the split's users
PERMANENT = re.compile(r"^(versions:.+|events|events:added|events:lost|(hist|hver):u[123])$")


def test_only_bounded_or_never_evictable_keys_live_without_a_ttl(online: TestClient) -> None:
    """Histories of made-up users lived 30 days: a flood of fake ids filled Redis for a month."""
    for n in range(20):
        event = {"event_id": f"anon-{n}", "user_id": f"fake-{n}", "item_id": "m1", "type": "click"}
        assert online.post("/v1/events", json=event).status_code == 200
    known = {"event_id": "known-1", "user_id": "u1", "item_id": "m5", "type": "click"}
    assert online.post("/v1/events", json=known).status_code == 200
    for user in ("u1", "u2", "stranger"):
        assert online.post("/v1/recommend", json={"user_id": user, "k": 3}).status_code == 200
    state = online.app.state.slot.recommender.online  # type: ignore[attr-defined]
    ttl_cap = ServingConfig().unknown_history_ttl_s
    kinds: dict[str, int] = {}
    for raw in state.client.scan_iter(match=f"{state.ns}:*", count=1_000):
        key = raw.decode().removeprefix(f"{state.ns}:")
        ttl = state.client.ttl(raw)
        kind = key.split(":")[0]
        kinds[kind] = kinds.get(kind, 0) + 1
        if ttl == -1:
            assert PERMANENT.match(key), f"{key} lives for ever and is not bounded by the catalog"
        elif kind in ("hist", "hver"):
            assert 0 < ttl <= ttl_cap <= 24 * 3600, f"{key}: an anonymous user's history lives {ttl} s"
    assert {"hist", "hver", "seen", "result", "events", "versions"} <= set(kinds)
    assert kinds["hist"] == 20 + 2  # the fake users' and u1, u2's (seeded when first read)


@pytest.mark.parametrize("ttl", [0, 59, 31 * 86_400])
def test_anonymous_histories_must_expire_within_bounds(ttl: int) -> None:
    with pytest.raises(ValidationError, match="unknown_history_ttl_s"):
        ServingConfig(unknown_history_ttl_s=ttl)


def test_the_embedded_redis_can_only_evict_what_expires() -> None:
    with pytest.raises(ValidationError, match="redis_maxmemory_policy"):
        ServingConfig(redis_maxmemory_policy="allkeys-lru")  # type: ignore[arg-type]
    assert ServingConfig().redis_maxmemory_policy in ("volatile-lru", "volatile-ttl")
