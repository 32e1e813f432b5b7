"""Hot reload of rule sets and prompt templates from ``serving.versioned`` into running stages.

Each worker runs one ``VersionWatcher`` thread that reads the active pointers every
``serving.versions_poll_s`` seconds (one MGET per kind) and installs a new active version into
its stages: ``RulesStage.install`` for every rules stage, ``set_prompt_template`` for an LLM stage
that has it. The rules stages are swapped together under ``recsys.pipeline.STAGE_SWAP``, the
lock a request holds while it pins its stages, so one answer never mixes two rule sets: requests
in flight finish on the old version, the next ones use the new one. The worker that received an
admin PUT or rollback applies it at once; the others within one poll.

Sequence numbers (``serving.versioned``): each applier remembers the sequence of what it
serves (0: the start-up file). A worker installs only a higher sequence than its own (or the
same one, where the store settles a tie), so a slow poll can never put back an older version
over a newer publish. When the store's active sequence is lower than its own, or the store is
empty (a Redis restarted without persistence), the worker re-seeds it with what it serves and
that sequence (``VersionStore.publish(seed=True)``), which never overwrites a higher one: after a
restart the newest version any worker serves wins, and the others install it.

Deliberately left out: the admin HTTP routes (``serving.routes.admin``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Iterable
from typing import Any

from llm_rerank.template import parse_prompt_document
from recsys.contract import PromptHolder, ReloadableRules
from recsys.documents import DocumentError, check_version, parse_document
from recsys.pipeline import STAGE_SWAP, Pipeline
from recsys.redis_client import RedisUnavailable
from rules.gates import check_dropped
from rules.schema import RuleSet, parse_ruleset
from serving.versioned import Activation, VersionStore

log = logging.getLogger(__name__)


def document_json(data: dict[str, Any]) -> str:
    """The stored form of a validated document: compact JSON with sorted keys (``parse_document`` reads it)."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), default=str, allow_nan=False)


class RulesApplier:
    """Validates rule sets with ``rules.schema.parse_ruleset`` and installs them in every rules stage."""

    kind = "rules"

    def __init__(self, pipeline: Pipeline):
        self.stages: list[ReloadableRules] = [st for spec, st in pipeline.stages
                                              if spec.kind == "rules" and spec.enabled
                                              and isinstance(st, ReloadableRules)]
        self.applied: str | None = self._serving_version()
        self.seq = 0  # the sequence of what this worker serves (0: the start-up file)
        self.installed_document: dict[str, Any] | None = None  # the last one installed (re-seeds Redis)

    @property
    def available(self) -> bool:
        return bool(self.stages)

    def _serving_version(self) -> str | None:
        ruleset = self.stages[0].ruleset if self.stages else None
        return ruleset.version if ruleset is not None else None

    def validate(self, data: dict[str, Any], source: str) -> tuple[str, Any]:
        ruleset = parse_ruleset(data, source=source)  # RulesError is a ValueError naming rule and key
        for stage in self.stages:  # refused before publishing: never activate what a stage cannot apply
            stage.check(ruleset)  # RulesError naming the rule and the attribute this catalog lacks
        return ruleset.version, ruleset

    def check_gates(self, ruleset: RuleSet, source: str, acknowledged: Iterable[str] = ()) -> None:
        """``rules.gates.GatesDropped`` when ``ruleset`` drops a gate the served one enforces on this
        catalog without acknowledging it (in the document or in ``acknowledged``); called before a
        publish or rollback, never when installing what another worker published."""
        ack = [*ruleset.acknowledge_dropped_gates, *acknowledged]
        for stage in self.stages:
            before = stage.active
            if before is not None:
                check_dropped(before, stage.check(ruleset).ruleset, ack, source)

    def install(self, version: str, ruleset: Any, document: dict[str, Any] | None = None) -> None:
        views = [(st, st.prepare(ruleset)) for st in self.stages]  # may refuse: before any stage swaps
        with STAGE_SWAP:  # every rules stage at once: no request pins half of the change
            for stage, view in views:
                stage.install(view)
            self.applied = version
            self.installed_document = document

    def current_document(self) -> dict[str, Any] | None:
        """What this worker serves: the last installed document, else the start-up rule set file.

        Used to re-seed an empty store (a restarted Redis): a rule set published at run time
        keeps serving and stays the active version, never the file it started with.
        """
        if self.installed_document is not None:
            return self.installed_document
        path = self.stages[0].ruleset_path if self.stages else None
        return parse_document(path.read_text(), str(path)) if path is not None else None


class PromptApplier:
    """Validates prompt documents (``llm_rerank.template``) and installs them in every LLM stage.

    ``validate`` refuses an unknown key, a text out of its bounds, an unknown placeholder or a
    chat special token, with an error naming the key (the admin route answers 422); a document
    without ``version`` is named by its content hash. ``install`` hands the parsed
    ``PromptTemplate`` to each enabled LLM stage's ``set_prompt_template``, and to each of ``also``
    (the backbone the server loaded for reasons, ``serving.explaining.Explanations``).
    """

    kind = "prompts"

    def __init__(self, pipeline: Pipeline, also: Iterable[PromptHolder] = ()):
        self.stages: list[PromptHolder] = [st for spec, st in pipeline.stages
                                           if spec.kind == "llm" and spec.enabled and isinstance(st, PromptHolder)]
        self.stages += also
        self.applied: str | None = None
        self.seq = 0
        self.installed_document: dict[str, Any] | None = None
        self.available = True  # templates are stored and versioned even without a stage to use them

    def validate(self, data: dict[str, Any], source: str) -> tuple[str, Any]:
        template = parse_prompt_document(data, source)  # PromptError (a ValueError) naming the key
        version = template.version
        if version is None:
            version = "sha-" + hashlib.sha256(document_json(data).encode()).hexdigest()[:12]
        check_version(self.kind, version)
        return version, template

    def install(self, version: str, template: Any, document: dict[str, Any] | None = None) -> None:
        with STAGE_SWAP:
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
        self._bad: dict[str, Activation] = {}  # kind -> active version that failed to parse (logged once)

    def install(self, kind: str, version: str, parsed: Any, document: dict[str, Any] | None = None,
                seq: int = 0) -> bool:
        """Install ``parsed`` (validated from ``document``) as ``version`` of ``kind``, activated with
        sequence ``seq``, unless this worker already serves a higher sequence (then False)."""
        applier = self.appliers[kind]
        with self._lock:
            if seq < applier.seq:
                log.warning("not installing %s version %s (sequence %d): already serving %s (sequence %d)",
                            kind, version, seq, applier.applied, applier.seq)
                return False
            applier.install(version, parsed, document)
            applier.seq = seq
        log.info("%s version %s installed (sequence %d)", kind, version, seq)
        return True

    def sync_once(self) -> None:
        """Install every kind's active version when newer than what this worker serves; re-seed the
        store when it is empty or older (a restarted Redis)."""
        for kind, applier in self.appliers.items():
            if not applier.available:
                continue
            active = self.store.active_entry(kind)
            if active is None or active.seq < applier.seq:
                self._seed(kind, applier, active)
            elif active.version != applier.applied:
                if self._bad.get(kind) != active:
                    self._load(kind, applier, active)
            elif active.seq > applier.seq:
                with self._lock:  # the same version activated again (a rollback to it): remember the sequence
                    applier.seq = max(applier.seq, active.seq)

    def _seed(self, kind: str, applier: Any, found: Activation | None) -> None:
        doc = applier.current_document()
        if doc is None:
            return
        version, _ = applier.validate(doc, f"{kind} served at start-up")
        out = self.store.publish(kind, version, document_json(doc), floor=applier.seq, seed=True)
        if out.status != "kept" and found is not None:
            log.warning("%s store held %s (sequence %d), older than served %s (sequence %d): re-seeded it",
                        kind, found.version, found.seq, version, applier.seq)
        elif out.status != "kept" and applier.seq > 0:
            log.warning("%s store was empty (Redis restarted?): re-seeded it with served %s (sequence %d)",
                        kind, version, applier.seq)

    def _load(self, kind: str, applier: Any, active: Activation) -> None:
        version = active.version
        text = self.store.document(kind, version)
        try:
            if text is None:
                raise DocumentError(f"active {kind} version {version!r} has no document")
            data = parse_document(text, f"{kind} version {version!r}")
            _, parsed = applier.validate(data, f"{kind} version {version!r}")
        except ValueError as exc:
            self._bad[kind] = active
            log.error("not installing %s: %s (still serving %s)", kind, exc, applier.applied)
            return
        self.install(kind, version, parsed, data, active.seq)

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
