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

from llm_rerank.template import parse_prompt_document
from recsys.documents import DocumentError, check_version, parse_document
from recsys.pipeline import Pipeline
from recsys.redis_state import RedisUnavailable
from rules.schema import parse_ruleset
from serving.versioned import VersionStore

log = logging.getLogger(__name__)


def canonical(data: dict[str, Any]) -> str:
    """The stored form of a validated document: compact JSON with sorted keys (``parse_document`` reads it)."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), default=str, allow_nan=False)


class RulesApplier:
    """Validates rule sets with ``rules.schema.parse_ruleset`` and installs them in every rules stage."""

    kind = "rules"

    def __init__(self, pipeline: Pipeline):
        self.stages: list[Any] = [st for spec, st in pipeline.stages
                                  if spec.kind == "rules" and spec.enabled and hasattr(st, "use")]
        self.applied: str | None = self._serving_version()
        self.installed_document: dict[str, Any] | None = None  # the last one installed (re-seeds Redis)

    @property
    def available(self) -> bool:
        return bool(self.stages)

    def _serving_version(self) -> str | None:
        rulesets = [getattr(st, "ruleset", None) for st in self.stages]
        return rulesets[0].version if rulesets and rulesets[0] is not None else None

    def validate(self, data: dict[str, Any], source: str) -> tuple[str, Any]:
        ruleset = parse_ruleset(data, source=source)  # RulesError is a ValueError naming rule and key
        for stage in self.stages:  # refused before publishing: never activate what a stage cannot apply
            check = getattr(stage, "check", None)
            if check is not None:
                check(ruleset)  # RulesError naming the rule and the attribute this catalog lacks
        return ruleset.version, ruleset

    def install(self, version: str, ruleset: Any, document: dict[str, Any] | None = None) -> None:
        for stage in self.stages:
            stage.use(ruleset, stage.items)
        self.applied = version
        self.installed_document = document

    def current_document(self) -> dict[str, Any] | None:
        """What this worker serves: the last installed document, else the start-up rule set file.

        Used to re-seed an empty store (a restarted Redis): a rule set published at run time
        keeps serving and stays the active version, never the file it started with.
        """
        if self.installed_document is not None:
            return self.installed_document
        path = getattr(self.stages[0], "ruleset_path", None) if self.stages else None
        return parse_document(path.read_text(), str(path)) if path is not None else None


class PromptApplier:
    """Validates prompt documents (``llm_rerank.template``) and installs them in every LLM stage.

    ``validate`` refuses an unknown key, a text out of its bounds, an unknown placeholder or a
    chat special token, with an error naming the key (the admin route answers 422); a document
    without ``version`` is named by its content hash. ``install`` hands the parsed
    ``PromptTemplate`` to each enabled LLM stage's ``set_prompt_template``.
    """

    kind = "prompts"

    def __init__(self, pipeline: Pipeline):
        self.stages: list[Any] = [st for spec, st in pipeline.stages
                                  if spec.kind == "llm" and spec.enabled and hasattr(st, "set_prompt_template")]
        self.applied: str | None = None
        self.installed_document: dict[str, Any] | None = None
        self.available = True  # templates are stored and versioned even without a stage to use them

    def validate(self, data: dict[str, Any], source: str) -> tuple[str, Any]:
        template = parse_prompt_document(data, source)  # PromptError (a ValueError) naming the key
        version = template.version
        if version is None:
            version = "sha-" + hashlib.sha256(canonical(data).encode()).hexdigest()[:12]
        check_version(self.kind, version)
        return version, template

    def install(self, version: str, template: Any, document: dict[str, Any] | None = None) -> None:
        for stage in self.stages:
            stage.set_prompt_template(template)
        self.applied = version
        self.installed_document = document

    def current_document(self) -> dict[str, Any] | None:
        """The last installed prompt document (re-seeds a restarted store); None for the built-in one."""
        return self.installed_document


class VersionWatcher:
    """Keeps one worker's stages on the active versions; started and stopped by the app lifespan."""

    def __init__(self, store: VersionStore, appliers: list[Any], poll_s: float):
        self.store, self.poll_s = store, poll_s
        self.appliers = {a.kind: a for a in appliers}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bad: dict[str, str] = {}  # kind -> active version that failed to parse (logged once)

    def install(self, kind: str, version: str, parsed: Any, document: dict[str, Any] | None = None) -> None:
        """Install ``parsed`` (validated from ``document``) as ``version`` of ``kind`` in this worker."""
        with self._lock:
            self.appliers[kind].install(version, parsed, document)
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
        self.install(kind, version, parsed, data)

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
