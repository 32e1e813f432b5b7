"""Experiment config validation and salted-hash assignment: sticky, independent, on-share."""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest
from pydantic import ValidationError

from recsys.experiments import (
    HOLDOUT,
    ExperimentsConfig,
    VariantOverrides,
    active_experiment,
    assign,
    boundaries,
    bucket,
    user_hash,
)


def config(**kw) -> ExperimentsConfig:
    base = {"enabled": True, "name": "exp1", "salt": "s1", "holdout": 0.1,
            "variants": [{"name": "control", "share": 0.45},
                         {"name": "treatment", "share": 0.45, "overrides": {"llm": True}}]}
    return ExperimentsConfig.model_validate({**base, **kw})


def test_bucket_is_blake2b_of_salt_experiment_user_mod_10000() -> None:
    digest = hashlib.blake2b(b"s1:exp1:u42", digest_size=8).digest()
    assert bucket("s1", "exp1", "u42") == int.from_bytes(digest, "big") % 10_000
    assert bucket("s1", "exp1", "u42") == user_hash("s1", "exp1", "u42") % 10_000


def test_assignment_is_sticky_and_a_pure_function_of_config() -> None:
    cfg = config()
    first = [assign(cfg, f"user{i}") for i in range(500)]
    again = [assign(config(), f"user{i}") for i in range(500)]  # another "worker" building its own config
    assert first == again


def test_shares_match_configuration_on_100k_ids() -> None:
    cfg = config()
    counts = Counter(assign(cfg, str(i)).variant for i in range(100_000))
    assert set(counts) == {HOLDOUT, "control", "treatment"}
    # binomial sd at n=1e5, p=0.45 is ~157 users; 0.6 pp is ~4 sd
    assert abs(counts[HOLDOUT] / 100_000 - 0.10) < 0.006
    assert abs(counts["control"] / 100_000 - 0.45) < 0.006
    assert abs(counts["treatment"] / 100_000 - 0.45) < 0.006


def test_new_salt_reshuffles_and_experiments_are_independent() -> None:
    a = [assign(config(), str(i)).variant for i in range(2000)]
    b = [assign(config(salt="s2"), str(i)).variant for i in range(2000)]
    c = [assign(config(name="exp2"), str(i)).variant for i in range(2000)]
    # independent assignments agree about 0.1^2 + 2 * 0.45^2 = 41.5% of the time
    for other in (b, c):
        agree = sum(x == y for x, y in zip(a, other, strict=True)) / 2000
        assert 0.35 < agree < 0.48


def test_boundaries_cover_every_bucket() -> None:
    cfg = ExperimentsConfig(variants=[{"name": "a", "share": 0.1}, {"name": "b", "share": 0.2},
                                      {"name": "c", "share": 0.7}])
    assert boundaries(cfg) == [("a", 1000), ("b", 3000), ("c", 10_000)]


def test_bad_split_is_refused_naming_the_values() -> None:
    with pytest.raises(ValidationError, match=r"sum to 0\.9, not 1"):
        config(holdout=0.0)
    with pytest.raises(ValidationError, match="unique"):
        config(holdout=0.0, variants=[{"name": "a", "share": 0.5}, {"name": "a", "share": 0.5}])
    with pytest.raises(ValidationError, match="holdout"):
        config(holdout=0.0, variants=[{"name": "holdout", "share": 1.0}])
    with pytest.raises(ValidationError, match="fusion_weights"):
        VariantOverrides(fusion_weights={"coarse": 0.0})


def test_overrides_and_active_experiment() -> None:
    cfg = config()
    assert cfg.overrides("treatment").llm is True
    assert cfg.overrides(HOLDOUT) == VariantOverrides()
    assert cfg.shares() == {HOLDOUT: 0.1, "control": 0.45, "treatment": 0.45}
    assert cfg.control == "control"

    class S:
        experiments = cfg

    class Off:
        experiments = config(enabled=False)

    assert active_experiment(S()) is cfg
    assert active_experiment(Off()) is None
    assert active_experiment(object()) is None
