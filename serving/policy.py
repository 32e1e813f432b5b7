"""The traffic policy: which requests take the LLM path, and when a cached answer may serve.

Only part of the traffic pays for the LLM re-ranker. A user is in the LLM share when the hash
of ``salt:user_id`` falls below ``llm_share``: deterministic (a user keeps one experience
across requests and workers) and uniform over users, the usual way to assign traffic
buckets (Kohavi et al., "Trustworthy Online Controlled Experiments", ch. 14). The hash is
the experiments' own (``recsys.experiments.user_hash``), so one function places users in
every split; the policy salt keeps the LLM share independent of the experiment arms. A
request may opt in or out with ``llm: true|false``. When the LLM stage is disabled or not loaded the
request takes the light path: "LLM not available" never fails a request.

The result cache key covers everything the answer depends on: user, k, context, the
user's history version (an event invalidates by changing it) and every model, rule and
prompt version (a hot-swapped rule set invalidates at once), plus the path.

Deliberately left out: running the pipeline and storing answers (``serving.service``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from recsys.experiments import user_hash

# llm_disabled: no LLM stage is enabled in the config; llm_unavailable: one is, but it failed to load
RouteReason = Literal["opt_in", "opt_out", "share", "not_in_share", "llm_disabled", "llm_unavailable"]


def llm_bucket(user_id: str, salt: str) -> float:
    """The user's position in [0, 1): ``user_hash(salt, user_id)`` as a fraction of 2**64.

    >>> llm_bucket("u1", "s") == llm_bucket("u1", "s") and 0.0 <= llm_bucket("u1", "s") < 1.0
    True
    """
    return user_hash(salt, user_id) / 2.0**64


@dataclass(frozen=True)
class Route:
    llm: bool  # run the LLM stage(s)
    reason: RouteReason


def choose_route(user_id: str, opt: bool | None, llm_share: float, salt: str, llm_available: bool,
                 llm_configured: bool = True) -> Route:
    """The path of one request: explicit opt-in/out wins, then the user's hash bucket. Without a loaded
    LLM stage, the light path: ``llm_disabled`` when the config enables none (``llm_configured`` False),
    ``llm_unavailable`` when it does but the stage failed to load.

    >>> choose_route("u1", True, 0.0, "s", llm_available=False)
    Route(llm=False, reason='llm_unavailable')
    >>> choose_route("u1", True, 0.0, "s", llm_available=False, llm_configured=False)
    Route(llm=False, reason='llm_disabled')
    >>> choose_route("u1", None, 1.0, "s", llm_available=True)
    Route(llm=True, reason='share')
    """
    if not 0.0 <= llm_share <= 1.0:
        raise ValueError(f"llm_share must be in [0, 1], got {llm_share}")
    if opt is False:
        return Route(False, "opt_out")
    if not llm_available:
        return Route(False, "llm_unavailable" if llm_configured else "llm_disabled")
    if opt is True:
        return Route(True, "opt_in")
    if llm_bucket(user_id, salt) < llm_share:
        return Route(True, "share")
    return Route(False, "not_in_share")


def result_cache_key(
    user_id: str,
    k: int,
    context: Mapping[str, Any] | None,
    history_version: int,
    versions: Mapping[str, str],
    llm: bool,
) -> str:
    """A digest of everything an answer depends on (context keys sorted: order is irrelevant)."""
    payload = json.dumps(
        [user_id, k, context or {}, history_version, sorted(versions.items()), llm],
        sort_keys=True, separators=(",", ":"), default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:32]
