"""One size limit for admin documents, whether sent to PUT /admin/rules or read from a file."""

from __future__ import annotations

from pathlib import Path

import pytest

from cascade.serving_config import ServingConfig
from recsys.documents import MAX_DOCUMENT_CHARS
from rules.schema import RulesError, load_ruleset

RULE = "rules:\n  - {id: gate, kind: audience_gate, audience: adult, min_age: 18}\n"


def test_the_document_limit_is_the_default_http_body_cap() -> None:
    assert MAX_DOCUMENT_CHARS == ServingConfig().max_body_bytes == 64 * 1024


def test_a_rule_set_file_beyond_the_limit_is_refused_and_one_within_it_loads(tmp_path: Path) -> None:
    within = tmp_path / "within.yaml"
    within.write_text(f'version: "w"\ndescription: "{"x" * (MAX_DOCUMENT_CHARS - 200)}"\n{RULE}')
    assert load_ruleset(within).version == "w"
    beyond = tmp_path / "beyond.yaml"
    beyond.write_text(f'version: "b"\ndescription: "{"x" * (MAX_DOCUMENT_CHARS + 1)}"\n{RULE}')
    with pytest.raises(RulesError, match=f"document expands to more than {MAX_DOCUMENT_CHARS} characters"):
        load_ruleset(beyond)
