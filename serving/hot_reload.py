"""Hot reload of rule sets and prompt templates from ``serving.versioned`` into running stages.

Each worker runs one ``VersionWatcher`` thread that reads the active pointers every
``serving.versions_poll_s`` seconds (one GET per kind) and installs a new active version into
its stages: ``RulesStage.use`` for every rules stage, ``set_prompt_template`` for an LLM stage
that has it. The swap is one attribute assignment per stage, so requests in flight finish on
the old version and the next ones use the new one: no restart, no failed request. The worker
that received an admin PUT or rollback applies it at once; the others within one poll.

When the store has no active version yet (fresh Redis, or Redis restarted without
persistence), the watcher publishes what its stages serve now (``only_if_empty``), so the
first version stays available for rollback.

Deliberately left out: the admin HTTP routes (``serving.routes.admin``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from typing import Any

import yaml

from recsys.pipeline import Pipeline
from serving.redis_state import RedisUnavailable
from serving.versioned import VersionStore

log = logging.getLogger(__name__)


class DocumentError(ValueError):
    """A rules/prompt document is not valid; the message says why."""


def parse_document(text: str | bytes, source: str) -> dict[str, Any]:
    """A YAML or JSON mapping (JSON is YAML); ``DocumentError`` otherwise."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise DocumentError(f"{source}: not valid YAML/JSON: {exc}") from exc
    if not isinstance(data, dict) or not data:
        raise DocumentError(f"{source}: must be a non-empty mapping, got {type(data).__name__}")
    return data


def canonical(data: dict[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)


class RulesApplier:
    """Validates rule sets with ``rules.schema.parse_ruleset`` and installs them in every rules stage."""

    kind = "rules"

    def __init__(self, pipeline: Pipeline):
        self.stages: list[Any] = [st for spec, st in pipeline.stages
                                  if spec.kind == "rules" and spec.enabled and hasattr(st, "use")]
        self.applied: str | None = self._serving_version()

    @property
    def available(self) -> bool:
        return bool(self.stages)

    def _serving_version(self) -> str | None:
        rulesets = [getattr(st, "ruleset", None) for st in self.stages]
        return rulesets[0].version if rulesets and rulesets[0] is not None else None

    def validate(self, data: dict[str, Any], source: str) -> tuple[str, Any]:
        from rules.schema import parse_ruleset

        ruleset = parse_ruleset(data, source=source)  # RulesError is a ValueError naming rule and key
        return ruleset.version, ruleset

    def install(self, version: str, ruleset: Any) -> None:
        for stage in self.stages:
            stage.use(ruleset, stage.items)
        self.applied = version

    def current_document(self) -> dict[str, Any] | None:
        path = getattr(self.stages[0], "ruleset_path", None) if self.stages else None
        return parse_document(path.read_text(), str(path)) if path is not None else None


class PromptApplier:
    """Stores prompt templates; hands them to an LLM stage that exposes ``set_prompt_template``."""

    kind = "prompts"

    def __init__(self, pipeline: Pipeline):
        self.stages: list[Any] = [st for spec, st in pipeline.stages
                                  if spec.kind == "llm" and spec.enabled and hasattr(st, "set_prompt_template")]
        self.applied: str | None = None
        self.available = True  # templates are stored and versioned even without a stage to use them

    def validate(self, data: dict[str, Any], source: str) -> tuple[str, Any]:
        version = data.get("version")
        if version is None:
            version = "sha-" + hashlib.sha256(canonical(data).encode()).hexdigest()[:12]
        elif not isinstance(version, str | int | float) or str(version) == "":
            raise DocumentError(f"{source}: 'version' must be a non-empty string")
        return str(version), data

    def install(self, version: str, template: dict[str, Any]) -> None:
        for stage in self.stages:
            stage.set_prompt_template(template)
        self.applied = version

    def current_document(self) -> dict[str, Any] | None:
        return None  # the stage's built-in template is not a stored version


class VersionWatcher:
    """Keeps one worker's stages on the active versions; started and stopped by the app lifespan."""

    def __init__(self, store: VersionStore, appliers: list[Any], poll_s: float):
        self.store, self.poll_s = store, poll_s
        self.appliers = {a.kind: a for a in appliers}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bad: dict[str, str] = {}  # kind -> active version that failed to parse (logged once)

    def install(self, kind: str, version: str, parsed: Any) -> None:
        with self._lock:
            self.appliers[kind].install(version, parsed)
        log.info("%s version %s installed", kind, version)

    def sync_once(self) -> None:
        """Install every kind's active version if it differs from what this worker serves."""
        for kind, applier in self.appliers.items():
            if not applier.available:
                continue
            active = self.store.active(kind)
            if active is None:
                self._seed(kind, applier)
            elif active != applier.applied and self._bad.get(kind) != active:
                self._load(kind, applier, active)

    def _seed(self, kind: str, applier: Any) -> None:
        doc = applier.current_document()
        if doc is not None:
            version, _ = applier.validate(doc, f"{kind} served at start-up")
            self.store.publish(kind, version, canonical(doc), only_if_empty=True)

    def _load(self, kind: str, applier: Any, version: str) -> None:
        text = self.store.document(kind, version)
        try:
            if text is None:
                raise DocumentError(f"active {kind} version {version!r} has no document")
            data = parse_document(text, f"{kind} version {version!r}")
            _, parsed = applier.validate(data, f"{kind} version {version!r}")
        except ValueError as exc:
            self._bad[kind] = version
            log.error("not installing %s: %s (still serving %s)", kind, exc, applier.applied)
            return
        self.install(kind, version, parsed)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync_once()
            except RedisUnavailable:
                pass  # the guard logged it; keep serving the installed versions
            except Exception:  # never let the watcher die: the next poll tries again
                log.exception("version watcher poll failed")
            self._stop.wait(self.poll_s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="version-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
