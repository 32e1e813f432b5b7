"""The item-tag JSON schema: the repo template, its catalog-specific instance, and validation.

``tag_schema.json`` (next to this module) is the template kept in the repo; its genre enum is
the placeholder ``"$CATALOG_CATEGORIES"``, replaced at job start by the catalog's category
vocabulary (the 18 MovieLens genres, or the synthetic catalog's category list), so the schema
hash recorded with every output names the exact genre list it was decoded against.

Validation uses ``jsonschema`` (Draft 2020-12). A record that fails after a retry becomes a
``fallback_record``: every field empty, ``fallback`` true and the reason kept.

Deliberately left out: grammar compilation (``jobs.tagging.generate``).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema

TEMPLATE_PATH = Path(__file__).with_name("tag_schema.json")
PLACEHOLDER = "$CATALOG_CATEGORIES"
FIELDS = ("genres", "audience", "risk_flags", "themes", "summary")


@lru_cache(maxsize=1)
def _template_text() -> str:
    return TEMPLATE_PATH.read_text()


def catalog_categories(category_lists: Iterable[Sequence[str]]) -> list[str]:
    """The sorted category vocabulary of a catalog (``items.categories`` column).

    >>> catalog_categories([["Drama"], ["Comedy", "Drama"], []])
    ['Comedy', 'Drama']
    """
    names = sorted({str(c) for cats in category_lists for c in cats})
    if not names:
        raise ValueError("catalog has no categories: the genre enum of the tag schema would be empty")
    return names


def concrete_schema(categories: Sequence[str]) -> dict[str, Any]:
    """The template with its genre enum set to ``categories`` (order kept)."""
    if not categories:
        raise ValueError("concrete_schema: categories must be non-empty")
    schema = copy.deepcopy(json.loads(_template_text()))
    genre_items = schema["properties"]["genres"]["items"]
    if genre_items.get("enum") != PLACEHOLDER:
        raise ValueError(f"{TEMPLATE_PATH}: genres.items.enum must be {PLACEHOLDER!r}")
    genre_items["enum"] = list(categories)
    return schema


def schema_hash(schema: dict[str, Any]) -> str:
    """Short sha256 of the canonical JSON of ``schema``."""
    return hashlib.sha256(json.dumps(schema, sort_keys=True).encode()).hexdigest()[:12]


def enum_of(schema: dict[str, Any], field: str) -> list[str]:
    """The closed value list of ``field`` (array items' enum or the field's own enum)."""
    prop = schema["properties"][field]
    return list(prop["items"]["enum"] if "items" in prop else prop["enum"])


def validation_errors(record: Any, schema: dict[str, Any]) -> list[str]:
    """Messages of every schema violation in ``record`` (empty list: valid)."""
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{'/'.join(map(str, e.path)) or '<root>'}: {e.message}" for e in validator.iter_errors(record)]


def parse_and_validate(text: str, schema: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """(record with list fields de-duplicated in order, "") or (None, reason) for ``text``."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        return None, f"not JSON ({e.msg} at char {e.pos})"
    errors = validation_errors(record, schema)
    if errors:
        return None, "; ".join(errors[:3])
    for field in ("genres", "risk_flags", "themes"):  # greedy decoding may repeat an enum value
        record[field] = list(dict.fromkeys(record[field]))
    return record, ""


def fallback_record(reason: str) -> dict[str, Any]:
    """The record kept for an item whose generation failed twice (never silently dropped)."""
    return {"genres": [], "audience": None, "risk_flags": [], "themes": [], "summary": "",
            "fallback": True, "reason": reason}
