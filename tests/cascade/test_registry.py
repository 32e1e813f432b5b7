"""The stage registry: every kind is built with its own settings section plus explicit context."""

from __future__ import annotations

from pathlib import Path

import pytest

from cascade.registry import STAGE_SECTIONS, build_stage, stage_context, weights_key
from cascade.settings import Settings
from recsys.config import STAGE_KINDS, StageSpec
from recsys.contract import Stage


def test_every_kind_names_a_settings_section() -> None:
    assert set(STAGE_SECTIONS) == set(STAGE_KINDS)
    assert set(STAGE_SECTIONS.values()) <= set(Settings.model_fields)


@pytest.mark.parametrize("kind", sorted(STAGE_KINDS))
def test_each_kind_gets_its_section_with_spec_params_on_top(kind: str) -> None:
    settings = Settings.build({})
    stage = build_stage(StageSpec(name=kind, kind=kind), settings)
    assert isinstance(stage, Stage) and stage.name == kind
    config = stage.cfg if kind == "llm" else stage.config  # type: ignore[attr-defined]
    assert config == getattr(settings, STAGE_SECTIONS[kind])


def test_params_override_the_section_and_bad_params_name_the_key() -> None:
    settings = Settings.build({"recall": {"popularity_share": 0.1}})
    stage = build_stage(StageSpec(name="recall", kind="recall", params={"popularity_share": 0.3}), settings)
    assert stage.config.popularity_share == 0.3  # type: ignore[attr-defined]
    assert settings.recall.popularity_share == 0.1  # the section itself is left alone
    with pytest.raises(ValueError, match="bogus"):
        build_stage(StageSpec(name="llm", kind="llm", params={"bogus": 1}), settings)


def test_fusion_gets_the_weights_key_of_the_whole_pipeline() -> None:
    settings = Settings.build({})
    fusion = build_stage(settings.pipeline.stage("fusion"), settings)
    assert fusion.weights_key == weights_key(settings)  # type: ignore[attr-defined]
    assert weights_key(settings).startswith("recall+coarse-")


def test_llm_context_resolves_redis_when_the_stage_is_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings.build({"artifacts_dir": str(tmp_path), "serving": {"redis_socket_timeout_s": 0.5}})
    monkeypatch.setenv("REDIS_URL", "redis://env:6379/0")  # after the settings were built
    assert stage_context("llm", settings) == {"artifacts_root": tmp_path, "redis_url": "redis://env:6379/0",
                                              "redis_socket_timeout_s": 0.5}
    stage = build_stage(StageSpec(name="llm", kind="llm"), settings)
    assert (stage.artifacts_root, stage.redis_url) == (tmp_path, "redis://env:6379/0")  # type: ignore[attr-defined]
    assert stage_context("recall", settings) == {}
