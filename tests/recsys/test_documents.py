"""``recsys.documents.parse_document``: JSON written with escaped non-BMP characters is text."""

from __future__ import annotations

import json

import pytest

from recsys.documents import DocumentError, parse_document


def test_escaped_surrogate_pairs_are_joined_as_json_reads_them() -> None:
    # json.dumps (ASCII by default), jq -a and Jackson write 🙂 as "\ud83d\ude42"; PyYAML read two lone
    # surrogates, which no later step could encode (the admin routes answered an unhelpful 422)
    doc = {"version": "v🏳️‍🌈", "rules": [{"id": "note🙂", "kind": "disclaimer", "text": "Heads up 👩‍💻"}]}
    assert parse_document(json.dumps(doc).encode(), "doc") == doc
    assert parse_document(json.dumps(doc, ensure_ascii=False).encode(), "doc") == doc


@pytest.mark.parametrize("body", ['{"version": "v", "s": "\\ud83d x"}', '{"version": "v", "s": ["\\ude42"]}'])
def test_an_unpaired_surrogate_is_named(body: str) -> None:
    with pytest.raises(DocumentError, match="holds an unpaired surrogate"):
        parse_document(body.encode(), "doc")
