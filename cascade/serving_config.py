"""Configuration of the HTTP service (``settings.serving``): limits, traffic policy, online state.

Request-shape limits that depend on the pipeline (the largest ``k``) live in
``recsys.config.PipelineConfig.max_k``; this model holds what only the HTTP layer uses.
Where Redis lives is ``settings.redis_url`` (``RECSYS_REDIS_URL``), else the plain
``REDIS_URL`` environment variable (``Settings.resolve_redis_url``), else an embedded server
(``recsys.redis_server``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator

from recsys.redis_client import DEFAULT_SOCKET_TIMEOUT_S
from recsys.redis_server import EvictionPolicy

EVENT_TYPES = ("impression", "click", "rating", "purchase", "add_to_cart")


MIN_ADMIN_KEY_CHARS = 12  # an empty or guessable key opens /admin as much as none


class ServingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = Field("127.0.0.1", description="Interface uvicorn binds to.")
    port: int = Field(8000, ge=1, le=65535, description="TCP port uvicorn binds to.")
    workers: int = Field(1, ge=1, le=64, description="uvicorn worker processes (each loads every artifact).")
    max_body_bytes: int = Field(64 * 1024, ge=1024, description="Requests with larger bodies get 413.")
    max_json_depth: int = Field(
        32, ge=2, le=1000, description="Deepest nesting of a JSON body; deeper bodies get 400 before parsing."
    )
    max_context_keys: int = Field(32, ge=0, le=1024, description="Most keys a request's `context` may hold.")
    max_context_bytes: int = Field(
        4096, ge=2, description="Largest `context` a request may send, measured as compact JSON."
    )
    ready_timeout_s: float = Field(
        300.0, gt=0, description="How long `start_server_subprocess` waits for /readyz before giving up."
    )
    # traffic policy (serving.policy)
    llm_share: float = Field(
        0.0, ge=0.0, le=1.0, description="Share of users (by hash of user id + salt) whose requests take the LLM path."
    )
    policy_salt: str = Field("recsys-llm-v1", description="Salt of the user hash; change it to reshuffle who gets the LLM.")
    result_cache_ttl_s: float = Field(30.0, ge=0, description="Result cache lifetime; 0 disables the cache.")
    # online state (recsys.redis_client, recsys.redis_server, serving.online_state)
    redis_namespace: str | None = Field(
        None, description="Prefix of every Redis key; None uses the artifact directory name (e.g. 'ml-100k')."
    )
    redis_socket_timeout_s: float = Field(
        DEFAULT_SOCKET_TIMEOUT_S, gt=0, le=10,
        description="Connect/read timeout: a dead Redis costs at most this per attempt."
    )
    redis_retry_min_s: float = Field(0.2, gt=0, description="First wait before retrying a Redis that failed.")
    redis_retry_max_s: float = Field(5.0, gt=0, description="Longest wait between retries (exponential backoff).")
    history_max_len: int = Field(500, ge=1, le=100_000, description="Most recent items kept per user in Redis.")
    history_event_types: list[str] = Field(
        default_factory=lambda: ["click", "rating", "purchase", "add_to_cart"],
        description="Event types appended to the user's history (impressions are not).",
    )
    events_stream_maxlen: int = Field(100_000, ge=100, description="Approximate cap of the events stream (XADD MAXLEN ~).")
    unknown_history_ttl_s: int = Field(
        6 * 3600, ge=60, le=30 * 86_400, description="Expiry of the Redis history of a user the split does not know, "
        "renewed by each of their events: events from made-up or one-off ids must not grow Redis. Known users' "
        "histories do not expire (they would re-seed from the split and lose their online events).")
    redis_persist: bool = Field(
        True, description="The embedded Redis keeps an append-only file (fsync every second) in redis_state_dir "
        "and reloads it at start; false keeps nothing on disk. An external Redis (redis_url) persists as it is "
        "configured.")
    redis_state_dir: Path | None = Field(
        None, description="Where the embedded Redis keeps its append-only file; None: state/redis under the "
        "served artifact directory.")
    redis_maxmemory_mb: int = Field(
        256, ge=16, le=1_048_576, description="Memory cap of the embedded Redis; past it Redis evicts keys that "
        "expire (histories of unknown users, cached answers) and refuses writes when none is left.")
    redis_maxmemory_policy: EvictionPolicy = Field(
        "volatile-lru", description="Eviction policy of the embedded Redis: only keys with a TTL can go, never "
        "rule or prompt versions or the event stream.")
    events_rate_per_s: float = Field(
        50.0, ge=0, le=100_000, description="Events per second one client may send to POST /v1/events (0 = no "
        "limit); past it the answer is 429 with Retry-After. Counted per worker process.")
    events_rate_burst: int = Field(
        200, ge=1, le=1_000_000, description="Events a client may send at once before events_rate_per_s applies.")
    rate_limit_client_header: str | None = Field(
        None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9-]+$",
        description="Header naming the client for the events rate limit (set it only behind a gateway that "
        "writes it); None: the client's address.")
    event_dedup_ttl_s: int = Field(86_400, ge=1, description="How long an event_id is remembered to drop duplicates.")
    versions_poll_s: float = Field(0.5, gt=0, le=60, description="How often a worker checks the active rules/prompt versions.")
    admin_api_key: SecretStr | None = Field(
        None, description=f"X-API-Key of the /admin routes, at least {MIN_ADMIN_KEY_CHARS} characters without "
        "surrounding spaces; None disables them (503)."
    )
    explain_needs_key: bool = Field(
        True, description="explain: true answers name items of the user's history in their reasons, so like debug "
        "they need X-API-Key (the admin key or debug_api_key; 403 otherwise). Set false where a gateway "
        "authenticates the end user before a request reaches this API.")
    debug_api_key: SecretStr | None = Field(
        None, description="An X-API-Key that opens debug answers (POST /v1/recommend with debug: true) but not "
        "/admin; the admin key opens them too. With neither, debug answers are refused (403).")

    @field_validator("admin_api_key", "debug_api_key")
    @classmethod
    def _usable_admin_key(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        # an empty key (e.g. RECSYS_SERVING__ADMIN_API_KEY="$KEY" after the command making KEY failed)
        # would match a request without any X-API-Key and open the admin routes to everyone
        if value is None:
            return None
        key = value.get_secret_value()
        what = "the /admin routes" if info.field_name == "admin_api_key" else "this key's debug answers"
        if key != key.strip() or len(key) < MIN_ADMIN_KEY_CHARS:
            raise ValueError(f"is {'empty' if not key else 'too short or padded with spaces'}: an API key needs "
                             f"at least {MIN_ADMIN_KEY_CHARS} characters (e.g. `openssl rand -hex 24`); leave it unset "
                             f"to turn {what} off")
        return value

    @field_validator("history_event_types")
    @classmethod
    def _known_event_types(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - set(EVENT_TYPES))
        if unknown:
            raise ValueError(f"unknown event type(s) {unknown}; known: {list(EVENT_TYPES)}")
        return value
