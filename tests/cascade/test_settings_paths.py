"""Relative paths in the settings are under the project root, whatever folder a command runs from."""

from __future__ import annotations

from pathlib import Path

import pytest

from cascade.registry import build_stage
from cascade.settings import DEFAULT_CONFIG, PROJECT_ROOT, Settings
from cli.common import artifact_dir
from llm_rerank.stage import LLMRerankStage

LLM_CONFIG = DEFAULT_CONFIG.parent / "pipeline_llm.yaml"


def test_the_llm_config_run_from_another_folder_finds_the_project_artifacts_and_models(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = Settings.from_yaml(LLM_CONFIG)
    assert settings.artifacts_dir == PROJECT_ROOT / "artifacts"
    assert artifact_dir(settings, None, None) == PROJECT_ROOT / "artifacts" / "synthetic"
    llm = build_stage(settings.pipeline.stage("llm"), settings)
    assert isinstance(llm, LLMRerankStage)
    assert llm.artifacts_root == PROJECT_ROOT / "artifacts"  # where the converted backbone is looked up
    assert not (tmp_path / "artifacts").exists()


def test_relative_paths_from_a_file_or_the_environment_are_under_the_project_root(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "mine.yaml"
    config.write_text("artifacts_dir: runs/shop\nllm: {int8_dir: quantised}\n")
    monkeypatch.setenv("RECSYS_LLM__MODEL_CACHE_DIR", "cache/models")
    settings = Settings.from_yaml(config)
    assert settings.artifacts_dir == PROJECT_ROOT / "runs" / "shop"
    assert settings.llm.int8_dir == PROJECT_ROOT / "quantised"
    assert settings.llm.model_cache_dir == PROJECT_ROOT / "cache" / "models"


def test_absolute_paths_are_kept(tmp_path: Path) -> None:
    settings = Settings.build({"artifacts_dir": str(tmp_path), "llm": {"model_cache_dir": str(tmp_path / "m")}})
    assert settings.artifacts_dir == tmp_path and settings.llm.model_cache_dir == tmp_path / "m"
