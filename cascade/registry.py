"""Builds a ``Pipeline`` from settings: imports only the configured stage kinds, then loads them.

A stage never sees the whole ``Settings``: ``build_stage`` gives it its ``spec``, its own
section (``STAGE_SECTIONS``: kind -> the ``Settings`` field, e.g. ``llm`` -> ``settings.llm``)
and, for the kinds that need more, explicit keyword arguments computed here from the settings
(``stage_context``: the LLM stage's artifacts root and the Redis client of its KV cache tier 2,
fusion's weights key). A server passes its own Redis client, so the LLM stage shares its pool.
The class behind a kind is ``STAGE_KINDS``, a table of the imported stage classes: every stage
module is cheap to import (torch, faiss, LightGBM and transformers load inside ``load``), so the
table costs no more than the modules' own light imports (pandas, scipy).

Called once at start-up by the server, the evaluator and the CLI; never per request.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from redis import Redis

from cascade.settings import Settings
from coarse_rank.config import TRAINING_REVISION as COARSE_TRAINING_REVISION
from coarse_rank.config import CoarseConfig
from coarse_rank.stage import CoarseStage
from fusion.stage import FusionStage, weights_key_for
from llm_rerank.stage import LLMRerankStage
from offline.split import Phase, split_id
from recall.config import DEFAULT_DEPTH, RecallConfig
from recall.llm_channel import LLMChannelRecallStage
from recall.stage import RecallStage
from recsys.config import StageSpec
from recsys.contract import ArtifactSubdir, Stage, WeightsLookup
from recsys.digest import json_sha256
from recsys.manifest import verify_directory
from recsys.pipeline import Pipeline
from recsys.redis_client import connect
from rules.stage import RulesStage
from rules.tagged import TaggedRulesStage

# kind -> the class implementing recsys.contract.Stage, built as Cls(spec, <its settings section>,
# **<its extra context>) (STAGE_SECTIONS, stage_context); the keys are recsys.config.KINDS
STAGE_KINDS: dict[str, type] = {
    "recall": RecallStage,
    "coarse": CoarseStage,
    "llm": LLMRerankStage,
    "rules": RulesStage,
    "fusion": FusionStage,
    "recall_llm": LLMChannelRecallStage,
    "rules_tagged": TaggedRulesStage,
}

RECALL_KINDS = ("recall", "recall_llm")  # the kinds whose load takes a phase (recall.stage.RecallStage.load)

# kind -> the Settings section its stage is built with, as Cls(spec, section, **stage_context(kind, settings))
STAGE_SECTIONS: dict[str, str] = {
    "recall": "recall",
    "recall_llm": "recall",
    "coarse": "coarse",
    "llm": "llm",
    "rules": "rules",
    "rules_tagged": "rules",
    "fusion": "fusion",
}


def weights_key(settings: Settings) -> str:
    """The fusion weights key of this pipeline (``fusion.stage.weights_key_for``)."""
    return weights_key_for(settings.pipeline.stages, settings.rules.ruleset_path)


def kv_tier2_client(settings: Settings, shared: Redis | None = None) -> Redis | None:
    """The Redis client of the LLM stage's KV cache tier 2: None when ``llm.kv`` does not ask for tier 2;
    a client of ``llm.kv.tier2_url`` when set; else ``shared`` (a server's own client: one pool for the
    online state and the cache); else a client of ``settings.resolve_redis_url()`` (a job run beside a
    server); None without any URL (tier 1 only). Clients connect on first use."""
    kv = settings.llm.kv
    if not (kv.enabled and kv.tier2):
        return None
    if kv.tier2_url is None and shared is not None:
        return shared
    url = kv.tier2_url or settings.resolve_redis_url()
    return connect(url, settings.serving.redis_socket_timeout_s) if url else None


def _llm_context(settings: Settings, redis: Redis | None) -> dict[str, Any]:
    return {"artifacts_root": settings.artifacts_dir, "redis": kv_tier2_client(settings, redis)}


def _fusion_context(settings: Settings, redis: Redis | None) -> dict[str, Any]:
    return {"weights_key": weights_key(settings)}


_CONTEXT: dict[str, Callable[[Settings, Redis | None], dict[str, Any]]] = {
    "llm": _llm_context, "fusion": _fusion_context}


def stage_section(kind: str, settings: Settings) -> BaseModel:
    """The ``Settings`` section a ``kind`` stage is built with (``STAGE_SECTIONS``)."""
    try:
        section: BaseModel = getattr(settings, STAGE_SECTIONS[kind])
    except KeyError:
        raise ValueError(f"stage kind {kind!r} has no settings section; known: {sorted(STAGE_SECTIONS)}") \
            from None
    return section


def stage_context(kind: str, settings: Settings, redis: Redis | None = None) -> dict[str, Any]:
    """The keyword arguments beyond ``(spec, section)`` a ``kind`` stage takes (none for most kinds);
    ``redis`` is the calling server's client, if any (``kv_tier2_client``)."""
    make = _CONTEXT.get(kind)
    return make(settings, redis) if make is not None else {}


def stage_class(kind: str) -> type:
    """The class behind ``kind`` (``STAGE_KINDS``)."""
    try:
        return STAGE_KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown stage kind {kind!r}; known kinds: {sorted(STAGE_KINDS)}") from None


def build_stage(spec: StageSpec, settings: Settings, *, cls: type | None = None, redis: Redis | None = None) -> Stage:
    """``Cls(spec, <its section>, **<its context>)`` for ``spec.kind``; cheap (nothing loaded yet).

    ``cls`` replaces the class ``STAGE_KINDS`` names (a stand-in built the same way, in tests);
    ``redis`` is the calling server's client (``stage_context``).
    """
    cls = cls or stage_class(spec.kind)
    stage = cls(spec, stage_section(spec.kind, settings), **stage_context(spec.kind, settings, redis))
    if not isinstance(stage, Stage):
        raise TypeError(f"{cls.__module__}:{cls.__qualname__} does not implement recsys.contract.Stage")
    return stage


def build_pipeline(
    settings: Settings, artifact_dir: Path, *, load: bool = True, only: tuple[str, ...] | None = None,
    phase: Phase = "test", redis: Redis | None = None,
) -> Pipeline:
    """Construct every enabled stage (disabled ones are kept, unloaded, for the trace).

    ``only`` keeps just the named stages (e.g. recall + coarse to produce LLM training data).
    ``phase="valid"`` builds the pipeline the jobs that tune or measure on valid items run: the
    recall stage loads the model that never learnt them and the valid-time popularity
    (``recall.stage.RecallStage.load``); ``"test"`` is the served pipeline. ``redis`` is the calling
    server's client, shared with the stages that use Redis (``stage_context``).
    """
    pairs: list[tuple[StageSpec, Stage]] = []
    for spec in settings.pipeline.stages:
        if only is not None and spec.name not in only:
            continue
        stage = build_stage(spec, settings, redis=redis)
        if load and spec.enabled:
            load_stage(spec, stage, Path(artifact_dir), phase)
        pairs.append((spec, stage))
    return Pipeline(pairs, request_budget_ms=settings.pipeline.request_budget_ms)


def load_stage(spec: StageSpec, stage: Stage, artifact_dir: Path, phase: Phase = "test") -> Stage:
    """``stage.load(artifact_dir)``, for ``phase`` (see ``build_pipeline``); the stage."""
    if phase != "test" and spec.kind in RECALL_KINDS:
        stage.load(artifact_dir, phase=phase)  # type: ignore[call-arg]
    else:
        stage.load(artifact_dir)
    return stage


def _recorded(meta: Path, key: str = "split_id") -> str | None:
    """What a ``stage.json`` records under ``key``; None when there is none or it cannot be read."""
    try:
        recorded = json.loads(meta.read_text())
    except (OSError, ValueError):  # absent, unreadable, not UTF-8, not JSON
        return None
    return recorded.get(key) if isinstance(recorded, dict) else None


class StaleArtifacts(ValueError):
    """Trained stages that do not belong to the split now under ``<artifact_dir>/split``."""


# the stages whose artifacts hold item and user indices into the split they were trained on
INDEXED_KINDS = (*RECALL_KINDS, "coarse")


def check_trained_on_split(pipeline: Pipeline, artifact_dir: Path) -> None:
    """``StaleArtifacts`` naming every enabled stage of an ``INDEXED_KINDS`` kind whose ``stage.json``
    records another split than ``<artifact_dir>/split`` (``offline.split.split_id``): the split was
    prepared again (new data, seed or k-core) and the stage was not retrained, so its item and user
    indices would be read against another catalog. Not checked: stages that hold no indices (the
    LLM re-ranker reads titles, fusion holds weights, rules hold ids), a stage without a readable
    ``stage.json`` (it cannot tell), and anything without a saved split.
    """
    artifact_dir = Path(artifact_dir)
    if not (artifact_dir / "split" / "split.json").is_file():
        return
    current = split_id(artifact_dir)
    stale = []
    for spec, stage in pipeline.stages:
        if spec.enabled and spec.kind in INDEXED_KINDS and _recorded(
                artifact_dir / _trained_dir(spec, stage) / "stage.json") not in (None, current):
            stale.append(spec.name)
    if stale:
        raise StaleArtifacts(f"{artifact_dir}: stage(s) {stale} were trained on another split than the one in "
                             f"{artifact_dir / 'split'} (it was prepared again since); run `recsys train` to retrain them")


def _trained_dir(spec: StageSpec, stage: Stage) -> str:
    """The folder a stage loads from: ``recall`` for every recall kind (``recall_llm`` serves the
    two-tower trained there), a coarse stage's ``subdir``, fusion's ``fusion/<weights key>``, else the kind."""
    if isinstance(stage, WeightsLookup):
        return f"fusion/{stage.weights_key}"
    if spec.kind in RECALL_KINDS:
        return "recall"
    return stage.subdir if isinstance(stage, ArtifactSubdir) else spec.kind


def check_artifact_digests(pipeline: Pipeline, artifact_dir: Path) -> None:
    """``recsys.manifest.ArtifactIntegrityError`` naming the first file of an enabled stage's trained
    folder that is missing or differs from its digest recorded at training: what every stage's ``load``
    checks anyway, asked before a server starts so that ``recsys serve`` refuses in one line."""
    for spec, stage in pipeline.stages:
        if spec.enabled:
            verify_directory(Path(artifact_dir) / _trained_dir(spec, stage))


# the settings that bound a training run (how long, on how many threads) without changing what a served
# model is asked to do: `recsys demo` caps the two-tower's logits, and serving the default config on
# its artifacts is what the demo means
TRAINING_BUDGET_KEYS: dict[str, frozenset[str]] = {
    "recall": frozenset({"max_epochs", "max_train_logits", "max_train_s", "train_threads"}),
    "recall_holdout": frozenset({"max_epochs", "max_train_logits", "max_train_s", "train_threads"}),
    "coarse": frozenset({"num_threads"}),
}


def config_id(settings: Settings, stage: str) -> str:
    """Digest of the config a stage is trained from: a changed setting (or a new default, e.g. a
    recall channel switched on) retrains the stage instead of serving stale artifacts.

    For the two-towers that is the recall section with the recall stage's ``params`` on top (what
    the stage serves: a channel switched off there changes the candidates coarse learns from) and
    the recall depth (the channel shares are gated at it, and coarse learns from candidates cut
    at it), and for ``recall_holdout`` the coarse ranker's ``train_positions`` (the items it holds
    out: with more positions, coarse would learn labels the held-out model had seen); a stage
    retrained for any of these makes the stages trained on its output stale too
    (``jobs.train.DEPENDS_ON``). A default depth or position count adds nothing to the digest, so
    artifacts trained before it was recorded keep theirs. The coarse digest holds
    ``coarse_rank.config.TRAINING_REVISION``: a fix to what it learns from retrains it.
    """
    return json_sha256(_trained_config(settings, stage))[:16]


def serving_config_id(settings: Settings, stage: str) -> str:
    """``config_id`` without the ``TRAINING_BUDGET_KEYS`` of ``stage``: what ``trained_under_other_settings``
    compares, since a model trained under another budget serves what these settings ask for."""
    config = _trained_config(settings, stage)
    if isinstance(config, dict):
        config = {k: v for k, v in config.items() if k not in TRAINING_BUDGET_KEYS.get(stage, ())}
    return json_sha256(config)[:16]


def _trained_config(settings: Settings, stage: str) -> Any:
    """The JSON-able config ``config_id`` digests (see there)."""
    config: Any
    if stage in ("recall", "recall_holdout"):
        depth = recall_depth(settings)
        config = {**recall_config(settings).model_dump(mode="json", exclude={"refit"} if stage == "recall_holdout"
                                                       else None),
                  **({"stage_depth": depth} if depth != DEFAULT_DEPTH else {})}
        positions = settings.coarse.train_positions  # what recall_holdout holds out: the coarse labels
        if stage == "recall_holdout" and positions != CoarseConfig().train_positions:
            config["held_out_positions"] = positions
    else:
        section = getattr(settings, stage, None)
        config = section.model_dump(mode="json") if section is not None else None
        if stage == "coarse":
            config = {**config, "training_revision": COARSE_TRAINING_REVISION}
    return config


def recall_config(settings: Settings) -> RecallConfig:
    """The ``RecallConfig`` the recall stage serves: ``settings.recall`` with its ``params`` on top."""
    spec = settings.pipeline.stage("recall")
    return settings.recall.for_stage(spec.kind, spec.params)


def recall_depth(settings: Settings) -> int:
    """The recall stage's depth (what its channel shares are gated at)."""
    return settings.pipeline.stage("recall").depth or DEFAULT_DEPTH


def trained_under_other_settings(settings: Settings, artifact_dir: Path) -> list[str]:
    """The served recall and coarse stages whose ``stage.json`` records another ``config_id`` than
    ``settings`` give them: ``serve`` and ``recommend`` serve them as trained (a training-only knob
    changed, e.g. ``recall.max_epochs`` for a quick run, is harmless) but say so, since a changed
    recall depth or ``params`` makes them serve a cascade that ``train`` would retrain. Stages without
    a recorded id (older artifacts) or in another subdir are not compared. The ``serving_config_id``
    is compared where recorded (a training budget, ``TRAINING_BUDGET_KEYS``, is not another setting),
    else the ``config_id``."""
    out = []
    for spec in settings.pipeline.stages:
        if not spec.enabled or spec.kind not in INDEXED_KINDS or spec.params.get("subdir"):
            continue
        stage = "recall" if spec.kind != "coarse" else "coarse"
        marker = Path(artifact_dir) / stage / "stage.json"
        recorded, current = _recorded(marker, "serving_config_id"), serving_config_id(settings, stage)
        if not recorded:
            recorded, current = _recorded(marker, "config_id"), config_id(settings, stage)
        if recorded and recorded != current:
            out.append(spec.name)
    return out
