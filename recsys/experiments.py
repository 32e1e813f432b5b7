"""Online experiments: the config model and the salted-hash assignment of users to variants.

One experiment runs at a time (``settings.experiments``). Each user falls in one bucket of
``[0, 10000)``: ``user_hash(salt, experiment, user_id)`` (BLAKE2b with an 8-byte digest of
``salt:experiment:user_id``) modulo 10,000 (the modulo bias of a 64-bit value is below 1e-15).
``user_hash`` is the project's one user-bucketing hash: serving's LLM share
(``serving.policy``) places users with it too, under its own salt. Buckets are laid out in
order: the holdout first (``[0, holdout * 10000)``), then each variant's share. Assignment is a pure
function of the config and the user id, so it is sticky across requests, workers and
restarts; a new ``salt`` reshuffles everyone (Kohavi et al., "Trustworthy Online Controlled
Experiments", 2020, ch. 14). Putting the experiment name in the hash keeps two experiments'
assignments independent even under one salt.

Holdout users are served the base configuration and recorded as variant ``"holdout"``; they
count in the sample-ratio check but are not a treatment.

A variant may override, deliberately few things (``VariantOverrides``):

- ``llm_share``: share of the variant's users sent down the LLM path (replaces ``serving.llm_share``);
- ``llm``: ``true`` puts every user of the variant on the LLM path (opt-in), ``false`` keeps
  them off it; a request's own ``llm`` field still wins;
- ``fusion_weights``: the fusion stage's weights for this variant (replacing tuned weights).

Deliberately left out: overlapping layers of concurrent experiments (Tang et al., 2010),
ramp-up schedules, and anything that does I/O (serving logs, ``jobs.ab`` analyses).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

N_BUCKETS = 10_000
HOLDOUT = "holdout"


class VariantOverrides(BaseModel):
    """What a variant changes relative to the base configuration (None: unchanged)."""

    model_config = ConfigDict(extra="forbid")

    llm_share: float | None = Field(None, ge=0.0, le=1.0, description="Share of the variant's users on the LLM path.")
    llm: bool | None = Field(None, description="true: LLM path for all the variant's users; false: never.")
    fusion_weights: dict[str, float] | None = Field(None, description="Fusion weights for this variant.")

    @field_validator("fusion_weights")
    @classmethod
    def _weights(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:
            return value
        bad = {k: w for k, w in value.items() if not math.isfinite(w) or w < 0}
        if bad or not any(w > 0 for w in value.values()):
            raise ValueError(f"fusion_weights must be finite, >= 0, with one > 0; got {value}")
        return value


class VariantSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    share: float = Field(gt=0.0, le=1.0, description="Share of all traffic (users) in this variant.")
    overrides: VariantOverrides = Field(default_factory=VariantOverrides)


class ExperimentsConfig(BaseModel):
    """``settings.experiments``: the active experiment, if ``enabled``.

    ``holdout`` plus the variants' shares must sum to 1. The first variant is the control.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="Assign users and log impressions only when true.")
    name: str = Field("default", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    salt: str = Field("recsys-ab-v1", min_length=1, description="Change it to reshuffle users between variants.")
    holdout: float = Field(0.0, ge=0.0, lt=1.0, description="Share of users held out on the base configuration.")
    variants: list[VariantSpec] = Field(
        default_factory=lambda: [VariantSpec(name="control", share=0.5), VariantSpec(name="treatment", share=0.5)]
    )

    @model_validator(mode="after")
    def _check_split(self) -> ExperimentsConfig:
        names = [v.name for v in self.variants]
        if not names:
            raise ValueError("experiments.variants is empty")
        if HOLDOUT in names or len(set(names)) != len(names):
            raise ValueError(f"experiments.variants: names must be unique and not {HOLDOUT!r}, got {names}")
        total = self.holdout + sum(v.share for v in self.variants)
        if abs(total - 1.0) > 1e-6:
            shares = {v.name: v.share for v in self.variants}
            raise ValueError(f"experiments: holdout {self.holdout} + variant shares {shares} sum to {total:g}, not 1")
        return self

    @property
    def control(self) -> str:
        return self.variants[0].name

    def shares(self) -> dict[str, float]:
        """Configured share of users per arm, holdout included when > 0 (the SRM check's expectation)."""
        out = {HOLDOUT: self.holdout} if self.holdout > 0 else {}
        return {**out, **{v.name: v.share for v in self.variants}}

    def overrides(self, variant: str) -> VariantOverrides:
        for v in self.variants:
            if v.name == variant:
                return v.overrides
        return VariantOverrides()  # holdout and unknown names: the base configuration


@dataclass(frozen=True)
class Assignment:
    experiment: str
    variant: str
    bucket: int


def user_hash(*parts: str) -> int:
    """A 64-bit salted hash of a user: BLAKE2b (8-byte digest) of the parts joined by ``:``, big-endian.

    Deterministic and uniform, so a user keeps one bucket across requests, workers and restarts
    (Kohavi et al. 2020, ch. 14); different salts or names give independent placements.

    >>> user_hash("s", "exp", "u1") == int.from_bytes(hashlib.blake2b(b"s:exp:u1", digest_size=8).digest(), "big")
    True
    """
    return int.from_bytes(hashlib.blake2b(":".join(parts).encode(), digest_size=8).digest(), "big")


def bucket(salt: str, experiment: str, user_id: str) -> int:
    """The user's bucket in ``[0, 10000)``.

    >>> bucket("s", "exp", "u1") == bucket("s", "exp", "u1") and 0 <= bucket("s", "exp", "u1") < 10000
    True
    """
    return user_hash(salt, experiment, user_id) % N_BUCKETS


def boundaries(config: ExperimentsConfig) -> list[tuple[str, int]]:
    """(arm, exclusive upper bucket) in layout order; the last bound is 10000.

    >>> cfg = ExperimentsConfig(holdout=0.1, variants=[{"name": "a", "share": 0.45}, {"name": "b", "share": 0.45}])
    >>> boundaries(cfg)
    [('holdout', 1000), ('a', 5500), ('b', 10000)]
    """
    out, cumulative = [], 0.0
    for name, share in config.shares().items():
        cumulative += share
        out.append((name, round(cumulative * N_BUCKETS)))
    out[-1] = (out[-1][0], N_BUCKETS)  # float sums like 0.1 + 0.2 must still cover every bucket
    return out


def assign(config: ExperimentsConfig, user_id: str) -> Assignment:
    """The arm of ``user_id`` (holdout or a variant) in the configured experiment."""
    b = bucket(config.salt, config.name, user_id)
    for name, upper in boundaries(config):
        if b < upper:
            return Assignment(config.name, name, b)
    raise AssertionError("unreachable: the last boundary is N_BUCKETS")  # pragma: no cover


def active_experiment(settings: object) -> ExperimentsConfig | None:
    """``settings.experiments`` when present and enabled, else None."""
    cfg = getattr(settings, "experiments", None)
    return cfg if isinstance(cfg, ExperimentsConfig) and cfg.enabled else None
