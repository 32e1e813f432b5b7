"""Bounded YAML/JSON documents: every hand-written file or admin document the system reads.

Config files (``cascade.settings``), rule sets (``rules.schema.load_ruleset``), prompt
documents (``llm_rerank.template.load_prompt_file``) and ``PUT /admin/{rules|prompts}`` bodies
all go through ``parse_document``: YAML (JSON is YAML) with duplicate keys refused, aliases
counted, and the expanded size, depth and numbers bounded, so a 500-byte "billion laughs" file is
refused at once wherever it is given instead of growing into gigabytes. ``check_version`` is
the one rule for version names (rule sets and prompts), wherever they are read.

Deliberately left out: schema validation (each reader validates its own document).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml

from recsys.names import NAME_PATTERN, forbidden_character

MAX_VERSION_CHARS = 128
# no control or invisible format characters (recsys.names): a version goes into logs, headers and answers
VERSION_PATTERN = NAME_PATTERN


class InvalidVersion(ValueError):
    """A version name outside the bounds every version shares (length, no control or invisible characters)."""


def check_version(kind: str, version: str) -> str:
    """``version`` when it is a valid version name, else ``InvalidVersion`` saying why.

    >>> check_version("rules", "movielens-2")
    'movielens-2'
    """
    if not 1 <= len(version) <= MAX_VERSION_CHARS:
        raise InvalidVersion(f"{kind} version is {len(version)} characters long; 1 to {MAX_VERSION_CHARS} allowed")
    if why := forbidden_character(version):
        raise InvalidVersion(f"{kind} version {version!r} holds {why}")
    return version


class DocumentError(ValueError):
    """A rules/prompt document is not valid; the message says why."""


# Bounds of an admin document once parsed, counted as expanded: a YAML alias counts its target
# again each time it is used, so a 376-byte "billion laughs" (anchors nested 7 levels deep)
# is refused after ~MAX_DOCUMENT_VALUES steps instead of growing into a 69 MB document.
MAX_DOCUMENT_VALUES = 10_000  # mappings, lists, keys and scalars
# summed length of the keys and string values: the default HTTP body cap (serving.max_body_bytes), so a rule
# set file that loads also fits a PUT /admin/rules body, and aliases cannot expand a document past it
MAX_DOCUMENT_CHARS = 64 * 1024
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


def parse_document(text: str | bytes, source: str, *, allow_empty: bool = False) -> dict[str, Any]:
    """A YAML or JSON mapping (JSON is YAML) within the bounds above; ``DocumentError`` otherwise.
    ``allow_empty``: an empty document (or only comments) is the empty mapping.

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
    if data is None and allow_empty:
        return {}
    if not isinstance(data, dict) or not data:
        raise DocumentError(f"{source}: must be a non-empty mapping, got {type(data).__name__}")
    _check_bounds(data, source)
    return _joined(data, source)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _joined(node: Any, source: str) -> Any:
    """``node`` with JSON's escaped surrogate pairs joined: ``json.dumps`` (ASCII by default), ``jq -a``
    and Jackson write an emoji as ``"\\ud83d\\ude42"``, which PyYAML reads as two lone surrogates
    (not text). An unpaired surrogate is a ``DocumentError``. Runs after ``_check_bounds``, so the
    walk is bounded as the document is."""
    if isinstance(node, dict):
        return {_joined(k, source): _joined(v, source) for k, v in node.items()}
    if isinstance(node, list):
        return [_joined(v, source) for v in node]
    if isinstance(node, str) and _SURROGATE.search(node):
        try:
            return node.encode("utf-16", "surrogatepass").decode("utf-16")
        except UnicodeDecodeError:
            raise DocumentError(f"{source}: {node[:40]!r} holds an unpaired surrogate (not text)") from None
    return node


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


def read_document(path: Path | str, what: str = "file", *, allow_empty: bool = False) -> dict[str, Any]:
    """``parse_document`` of a UTF-8 file; ``DocumentError`` naming the file (``what`` it should
    be, e.g. "config file") when it is missing, a directory, unreadable or not UTF-8.
    """
    path = Path(path)
    if not path.is_file():
        raise DocumentError(f"{path}: {what} {'is a directory' if path.is_dir() else 'not found'}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except OSError as exc:
        raise DocumentError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return parse_document(text, str(path), allow_empty=allow_empty)
