"""The stage registry: every kind is built with its own settings section plus explicit context."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from cascade.registry import (
    STAGE_KINDS,
    STAGE_SECTIONS,
    build_stage,
    kv_tier2_client,
    stage_context,
    weights_key,
)
from cascade.settings import Settings
from recsys.config import KINDS, StageSpec
from recsys.contract import (
    ArtifactSubdir,
    Backfilling,
    Pinnable,
    PromptHolder,
    ReloadableRules,
    Stage,
    WeightsLookup,
)


def test_every_kind_names_a_settings_section() -> None:
    assert set(STAGE_SECTIONS) == set(STAGE_KINDS) == set(KINDS)
    assert set(STAGE_SECTIONS.values()) <= set(Settings.model_fields)


@pytest.mark.parametrize("kind", sorted(STAGE_KINDS))
def test_each_kind_gets_its_section_with_spec_params_on_top(kind: str) -> None:
    settings = Settings.build({})
    stage = build_stage(StageSpec(name=kind, kind=kind), settings)
    assert isinstance(stage, Stage) and stage.name == kind
    config = stage.cfg if kind == "llm" else stage.config  # type: ignore[attr-defined]
    assert config == getattr(settings, STAGE_SECTIONS[kind])


def test_each_kind_declares_the_capabilities_its_callers_ask_for() -> None:
    """The optional protocols (``recsys.contract``) each built stage answers ``isinstance`` for."""
    settings = Settings.build({})
    protocols = (Pinnable, Backfilling, ReloadableRules, PromptHolder, WeightsLookup, ArtifactSubdir)
    has = {kind: {p.__name__ for p in protocols if isinstance(build_stage(StageSpec(name=kind, kind=kind), settings), p)}
           for kind in STAGE_KINDS}
    assert has == {
        "recall": {"Backfilling"}, "recall_llm": {"Backfilling"}, "coarse": {"ArtifactSubdir"},
        "llm": {"Pinnable", "PromptHolder"}, "rules": {"Pinnable", "ReloadableRules"},
        "rules_tagged": {"Pinnable", "ReloadableRules"}, "fusion": {"WeightsLookup"},
    }


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
    settings = Settings.build({"artifacts_dir": str(tmp_path), "serving": {"redis_socket_timeout_s": 0.5},
                               "llm": {"kv": {"tier2": True}}})
    monkeypatch.setenv("REDIS_URL", "redis://env:6379/0")  # after the settings were built
    context = stage_context("llm", settings)
    assert set(context) == {"artifacts_root", "redis"} and context["artifacts_root"] == tmp_path
    kwargs = context["redis"].connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["socket_timeout"]) == ("env", 6379, 0.5)
    stage = build_stage(StageSpec(name="llm", kind="llm"), settings)
    assert stage.artifacts_root == tmp_path  # type: ignore[attr-defined]
    assert stage.redis.connection_pool.connection_kwargs["host"] == "env"  # type: ignore[attr-defined]
    assert stage_context("recall", settings) == {}


def test_a_server_shares_its_redis_client_with_the_llm_kv_cache(tmp_path: Path) -> None:
    """One connection pool: the client a server passes is the one the LLM stage's tier 2 uses, unless
    ``llm.kv.tier2_url`` names another Redis; without tier 2 the stage gets no client at all."""
    shared = redis.Redis.from_url("redis://served:6379/0")
    settings = Settings.build({"artifacts_dir": str(tmp_path), "llm": {"kv": {"tier2": True}}})
    stage = build_stage(StageSpec(name="llm", kind="llm"), settings, redis=shared)
    assert stage.redis is shared  # type: ignore[attr-defined]
    elsewhere = Settings.build({"llm": {"kv": {"tier2": True, "tier2_url": "redis://kv:6379/0"}}})
    own = kv_tier2_client(elsewhere, shared)
    assert own is not shared and own is not None and own.connection_pool.connection_kwargs["host"] == "kv"
    assert kv_tier2_client(Settings.build({}), shared) is None


def test_stages_trained_on_another_split_are_named_before_anything_loads(tmp_path: Path) -> None:
    import json

    from cascade.registry import StaleArtifacts, build_pipeline, check_trained_on_split
    from offline.protocol import make_split
    from offline.split import split_id
    from offline.synthetic import generate

    settings = Settings.from_yaml(None)  # recall -> coarse -> llm (disabled) -> rules -> fusion
    pipeline = build_pipeline(settings, tmp_path, load=False)
    check_trained_on_split(pipeline, tmp_path)  # no split: nothing to compare with
    make_split(generate(n_users=20, n_items=40, seed=1), k_core=1).save(tmp_path / "split")
    current = split_id(tmp_path)

    def trained(directory: Path, on: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "stage.json").write_text(json.dumps({"split_id": on}))

    trained(tmp_path / "recall", current)
    trained(tmp_path / "coarse", current)
    trained(tmp_path / "fusion" / weights_key(settings), current)
    check_trained_on_split(pipeline, tmp_path)
    trained(tmp_path / "llm", "0ld")  # no item indices (and disabled here): not checked
    trained(tmp_path / "fusion" / weights_key(settings), "0ld")  # weights, no indices: not checked
    check_trained_on_split(pipeline, tmp_path)
    for broken in ("[]", "null", '{"split_id": ', "\xff"):  # cannot tell: not a refusal (nor a crash)
        (tmp_path / "recall" / "stage.json").write_text(broken, encoding="latin-1")
        check_trained_on_split(pipeline, tmp_path)
    trained(tmp_path / "recall", "0ld")
    trained(tmp_path / "coarse", "0ld")
    with pytest.raises(StaleArtifacts, match=r"stage\(s\) \['recall', 'coarse'\] were trained on another split .* "
                                             r"run `recsys train`"):
        check_trained_on_split(pipeline, tmp_path)
    # a recall_llm stage serves the two-tower trained in recall/: checked there
    llm_recall = settings.model_copy(update={"pipeline": settings.pipeline.model_copy(update={"stages": [
        s.model_copy(update={"kind": "recall_llm"}) for s in settings.pipeline.stages if s.kind == "recall"]})})
    with pytest.raises(StaleArtifacts, match=r"\['recall'\]"):
        check_trained_on_split(build_pipeline(llm_recall, tmp_path, load=False), tmp_path)
    # the tag-feature coarse model is checked in its own folder
    tags = settings.model_copy(update={"pipeline": settings.pipeline.model_copy(update={"stages": [
        s.model_copy(update={"params": {"subdir": "coarse_tags"}}) if s.kind == "coarse" else s
        for s in settings.pipeline.stages if s.kind in ("coarse",)]})})
    check_trained_on_split(build_pipeline(tags, tmp_path, load=False), tmp_path)  # no stage.json there yet
    trained(tmp_path / "coarse_tags", "0ld")
    with pytest.raises(StaleArtifacts, match=r"\['coarse'\]"):
        check_trained_on_split(build_pipeline(tags, tmp_path, load=False), tmp_path)


def test_serving_names_stages_trained_under_other_settings(tmp_path: Path) -> None:
    import json

    from cascade.registry import config_id, trained_under_other_settings

    trained = Settings.build({})
    for stage in ("recall", "coarse"):
        (tmp_path / stage).mkdir()
        (tmp_path / stage / "stage.json").write_text(json.dumps({"config_id": config_id(trained, stage)}))
    assert trained_under_other_settings(trained, tmp_path) == []
    # serve and recommend used to serve these silently, although `train` retrains them
    stages = [s.model_dump() for s in trained.pipeline.stages]
    stages[0]["params"] = {"covisit_channel": False}
    assert trained_under_other_settings(Settings.build({"pipeline": {"stages": stages}}), tmp_path) == ["recall"]
    assert trained_under_other_settings(Settings.build({"coarse": {"n_estimators": 7}}), tmp_path) == ["coarse"]
    # the default depth adds nothing to the digest: artifacts that recorded none keep matching
    stages[0]["params"], stages[0]["depth"] = {}, 200
    assert trained_under_other_settings(Settings.build({"pipeline": {"stages": stages}}), tmp_path) == []
    (tmp_path / "coarse" / "stage.json").write_text("{}")  # older artifacts: nothing recorded, nothing said
    assert trained_under_other_settings(Settings.build({"coarse": {"n_estimators": 7}}), tmp_path) == []


def test_the_refit_switch_retrains_the_served_recall_model_only() -> None:
    from cascade.registry import config_id

    on, off = Settings.build({"recall": {"refit": True}}), Settings.build({})
    assert config_id(on, "recall") != config_id(off, "recall")
    assert config_id(on, "recall_holdout") == config_id(off, "recall_holdout")  # never refit (recall.train)


def test_the_held_out_positions_retrain_the_held_out_recall_model_only() -> None:
    from cascade.registry import config_id
    from coarse_rank.config import CoarseConfig

    default = CoarseConfig().train_positions
    base, more = Settings.build({}), Settings.build({"coarse": {"train_positions": default + 1}})
    assert config_id(more, "recall_holdout") != config_id(base, "recall_holdout")  # it held out fewer labels
    assert config_id(more, "recall") == config_id(base, "recall")
    # the default adds nothing: artifacts trained before the positions were recorded keep their id
    assert config_id(Settings.build({"coarse": {"train_positions": default}}), "recall_holdout") == config_id(
        base, "recall_holdout")


def test_a_new_coarse_training_revision_retrains_coarse_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import cascade.registry as registry

    settings = Settings.build({})
    before = {stage: registry.config_id(settings, stage) for stage in ("recall", "recall_holdout", "coarse", "fusion")}
    monkeypatch.setattr(registry, "COARSE_TRAINING_REVISION", registry.COARSE_TRAINING_REVISION + 1)
    after = {stage: registry.config_id(settings, stage) for stage in before}
    assert [s for s in before if before[s] != after[s]] == ["coarse"]
