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
import math
import threading
from typing import Any

import yaml

from llm_rerank.template import parse_prompt_document
from recsys.pipeline import Pipeline
from recsys.redis_state import RedisUnavailable
from rules.schema import parse_ruleset
from serving.versioned import VersionStore, check_version

log = logging.getLogger(__name__)


class DocumentError(ValueError):
    """A rules/prompt document is not valid; the message says why."""


# Bounds of an admin document once parsed, counted as expanded: a YAML alias counts its target
# again each time it is used, so a 376-byte "billion laughs" (anchors nested 7 levels deep)
# is refused after ~MAX_DOCUMENT_VALUES steps instead of growing into a 69 MB document.
MAX_DOCUMENT_VALUES = 10_000  # mappings, lists, keys and scalars
MAX_DOCUMENT_CHARS = 256 * 1024  # summed length of the keys and string values
MAX_ALIASES = 100  # uses of ``*name`` in one document


class _AdminLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys and more than ``MAX_ALIASES`` aliases.

    PyYAML keeps the last of two equal keys silently; a rule set edited by hand that says
    ``version`` twice would publish whichever came last, so a repeat is an error naming it.
    """

    def __init__(self, stream: Any):
        super().__init__(stream)
        self.aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise yaml.composer.ComposerError(
                    None, None, f"more than {MAX_ALIASES} aliases (*name) in one document",
                    self.peek_event().start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # "<<" merges may be overridden by explicit keys; complex keys fail below
                key = self.construct_object(key_node, deep=True)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark, f"found duplicate key {key!r}",
                        key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_document(text: str | bytes, source: str) -> dict[str, Any]:
    """A YAML or JSON mapping (JSON is YAML) within the bounds above; ``DocumentError`` otherwise.

    >>> parse_document("version: a\\nrules: [{id: x}]", "doc")
    {'version': 'a', 'rules': [{'id': 'x'}]}
    >>> yaml_problem(yaml.YAMLError("oops"))
    'oops'
    """
    try:
        data = yaml.load(text, Loader=_AdminLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        raise DocumentError(f"{source}: not valid YAML/JSON: {yaml_problem(exc)}") from exc
    except RecursionError:
        raise DocumentError(f"{source}: nested too deeply") from None
    if not isinstance(data, dict) or not data:
        raise DocumentError(f"{source}: must be a non-empty mapping, got {type(data).__name__}")
    _check_bounds(data, source)
    return data


def yaml_problem(exc: yaml.YAMLError) -> str:
    """One line for a YAML error: the problem and where (PyYAML's own text spans several lines)."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem is None:
        return " ".join(str(exc).split())
    mark = exc.problem_mark
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    context = f" ({exc.context})" if exc.context else ""
    return f"{exc.problem}{where}{context}"


def _check_bounds(data: Any, source: str) -> None:
    """Walk ``data`` as expanded (iteratively) and stop at the first bound it breaks.

    Children are counted before they are pushed, so the walk itself never does more than
    ``MAX_DOCUMENT_VALUES`` steps however much the aliases would expand.
    """
    values, chars, stack = 1, 0, [data]
    while stack:
        node = stack.pop()
        if isinstance(node, dict | list):
            children = [*node.keys(), *node.values()] if isinstance(node, dict) else node
            values += len(children)
            if values > MAX_DOCUMENT_VALUES:
                raise DocumentError(f"{source}: document expands to more than {MAX_DOCUMENT_VALUES} values "
                                    "(an alias counts its target each time it is used)")
            stack.extend(children)
        elif isinstance(node, str):
            chars += len(node)
            if chars > MAX_DOCUMENT_CHARS:
                raise DocumentError(f"{source}: document expands to more than {MAX_DOCUMENT_CHARS} characters "
                                    "of text (an alias counts its target each time it is used)")
        elif isinstance(node, float) and not math.isfinite(node):
            raise DocumentError(f"{source}: non-finite number {node!r} (.nan/.inf) is not allowed")


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
