"""Hostile and mistaken admin documents: each is refused with a 422 naming the problem,
nothing is stored, and the rules in force keep serving.

Toy catalog with the real rules stage on the packaged default rule set: an unknown user
("stranger") never gets m4 (adult; an unknown age counts as a minor).
"""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from recsys.documents import MAX_ALIASES, MAX_DOCUMENT_CHARS, MAX_DOCUMENT_VALUES
from rules.schema import RulesError
from rules.stage import RulesStage
from tests.serving.conftest import ADMIN_KEY
from tests.serving.toy import DEFAULT_GATES

AUTH = {"X-API-Key": ADMIN_KEY}
ONE_RULE = "rules: [{id: no_m6, kind: blocklist, items: {item_ids: [m6]}}]\n"


def laughs(levels: int = 7) -> str:
    """A YAML 'billion laughs': anchors nested ``levels`` deep under ``description``."""
    lines = ["description:", "  - &x0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"  - &x{i} [{', '.join([f'*x{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "version: bomb-1\n" + ONE_RULE + "\n".join(lines) + "\n"


def published(client: TestClient, kind: str = "rules") -> list[str]:
    return [v["version"] for v in client.get(f"/admin/{kind}/versions", headers=AUTH).json()["versions"]]


def stranger_items(client: TestClient) -> list[str]:
    resp = client.post("/v1/recommend", json={"user_id": "stranger", "k": 5})
    assert resp.status_code == 200
    return [i["id"] for i in resp.json()["items"]]


def put(client: TestClient, document: str | dict, kind: str = "rules"):
    text = json.dumps(document) if isinstance(document, dict) else document
    return client.put(f"/admin/{kind}", content=text, headers=AUTH)


@pytest.mark.parametrize("kind", ["rules", "prompts"])
def test_yaml_alias_bomb_is_refused_before_it_expands(online: TestClient, kind: str) -> None:
    bomb = laughs()
    assert len(bomb) < 600  # ten million "lol"s once expanded
    before = published(online, kind)
    resp = put(online, bomb, kind)
    assert resp.status_code == 422
    assert resp.json()["detail"] == (f"PUT /admin/{kind}: document expands to more than {MAX_DOCUMENT_VALUES} "
                                     "values (an alias counts its target each time it is used)")
    assert published(online, kind) == before


def test_aliases_are_bounded_in_number_and_in_expanded_text(online: TestClient) -> None:
    many = "version: many-1\n" + ONE_RULE + "x: &a 1\ndescription: [" + ", ".join(["*a"] * (MAX_ALIASES + 1)) + "]\n"
    resp = put(online, many)
    assert resp.status_code == 422
    assert resp.json()["detail"] == (f"PUT /admin/rules: not valid YAML/JSON: more than {MAX_ALIASES} aliases "
                                     f"(*name) in one document at line 4, column {15 + 4 * MAX_ALIASES}")
    pad = "x" * 3000
    wide = f"version: wide-1\n{ONE_RULE}description: [&p {pad}, " + ", ".join(["*p"] * 90) + "]\n"
    assert len(wide) < 4000
    resp = put(online, wide)
    assert resp.status_code == 422
    assert resp.json()["detail"] == (f"PUT /admin/rules: document expands to more than {MAX_DOCUMENT_CHARS} "
                                     "characters of text (an alias counts its target each time it is used)")
    assert "many-1" not in published(online) and "wide-1" not in published(online)


def test_a_few_aliases_still_work(online: TestClient) -> None:
    doc = ("version: reuse-1\nrules:\n  - {id: no_m6, kind: blocklist, items: &sel {item_ids: [m6]}}\n"
           f"  - {{id: note_m6, kind: disclaimer, text: gone soon, items: *sel}}\nacknowledge_dropped_gates: {DEFAULT_GATES}\n")
    resp = put(online, doc)
    assert resp.status_code == 200 and resp.json()["version"] == "reuse-1"


DUP_JSON = ('{"version": "dup-1", "rules": [{"id": "a", "kind": "blocklist", "items": {"item_ids": ["m6"]}}], '
            '"version": "dup-2"}')


@pytest.mark.parametrize(("document", "line"), [
    ("version: dup-1\n" + ONE_RULE + "version: dup-2\n", "line 3, column 1"),
    (DUP_JSON, f"line 1, column {DUP_JSON.rindex('version')}"),  # the opening quote of the second key
])
def test_duplicate_keys_are_refused_naming_the_key(online: TestClient, document: str, line: str) -> None:
    resp = put(online, document)
    assert resp.status_code == 422
    assert resp.json()["detail"] == (f"PUT /admin/rules: not valid YAML/JSON: found duplicate key 'version' at "
                                     f"{line} (while constructing a mapping)")
    assert not {"dup-1", "dup-2"} & set(published(online))


def test_non_finite_numbers_in_a_document_are_refused(online: TestClient) -> None:
    resp = put(online, "version: nan-1\n" + ONE_RULE + "description: [1, .nan]\n")
    assert resp.status_code == 422
    assert resp.json()["detail"] == "PUT /admin/rules: non-finite number nan (.nan/.inf) is not allowed"


@pytest.mark.parametrize("document", [{"version": "empty-1"}, {"version": "empty-1", "rules": []},
                                      "version: empty-1\nrules:\n", "version: empty-1\nrules: []\nallow_empty: no\n"])
def test_a_rule_set_without_rules_is_refused_and_the_gates_stay_on(online: TestClient, document) -> None:
    assert "m4" not in stranger_items(online)
    resp = put(online, document)
    assert resp.status_code == 422
    assert "PUT /admin/rules: 'rules' " in resp.json()["detail"]
    assert "empty-1" not in published(online)
    assert "m4" not in stranger_items(online)  # fail closed: the adult gate is still on


def test_an_explicitly_empty_rule_set_is_published(online: TestClient) -> None:
    resp = put(online, f"version: open-1\nrules: []\nallow_empty: true\nacknowledge_dropped_gates: {DEFAULT_GATES}\n")
    assert resp.status_code == 200 and resp.json()["active"] == "open-1"
    assert "m4" in stranger_items(online)  # what was asked for, explicitly


def test_a_version_yaml_would_mangle_is_refused(online: TestClient) -> None:
    resp = put(online, "version: 1.10\n" + ONE_RULE)
    assert resp.status_code == 422
    assert resp.json()["detail"] == ("PUT /admin/rules: 'version' must be a string, got float 1.1: YAML reads an "
                                     "unquoted 1.10 as the number 1.1; quote it (version: \"1.10\")")
    assert "1.1" not in published(online)
    resp = put(online, 'version: "1.10"\n' + ONE_RULE + f"acknowledge_dropped_gates: {DEFAULT_GATES}\n")
    assert resp.status_code == 200 and resp.json()["version"] == "1.10"


@pytest.mark.parametrize(("version", "says"), [
    ("v\u0000x", "rules version 'v\\x00x' holds a control character ('\\x00' at 1)"),
    ("v1\nX-Injected: 1", "rules version 'v1\\nX-Injected: 1' holds a control character ('\\n' at 2)"),
    ("v1\u2066", "rules version 'v1\\u2066' holds an invisible format character (U+2066 LEFT-TO-RIGHT ISOLATE at 2)"),
    ("a" * 200, "rules version is 200 characters long; 1 to 128 allowed"),
])
def test_a_version_publish_would_refuse_is_refused(online: TestClient, version: str, says: str) -> None:
    resp = put(online, {"version": version, "rules": [{"id": "a", "kind": "blocklist", "items": {"item_ids": ["m6"]}}]})
    assert resp.status_code == 422
    assert resp.json()["detail"] == f"PUT /admin/rules: {says}"
    assert version not in published(online)
    back = online.post("/admin/rules/rollback", json={"version": version}, headers=AUTH)
    assert back.status_code == 422 and back.json()["detail"][0]["loc"] == ["body", "version"]


def test_every_version_publish_accepts_can_be_rolled_back_to(online: TestClient) -> None:
    first = online.get("/admin/rules/versions", headers=AUTH).json()["active"]
    longest = "v" * 128
    assert put(online, {"version": longest, "rules": [{"id": "a", "kind": "blocklist", "items": {"item_ids": ["m6"]}}],
                        "acknowledge_dropped_gates": DEFAULT_GATES}).status_code == 200
    assert online.post("/admin/rules/rollback", json={"version": first, "acknowledge_dropped_gates": ["blocklist:a"]},
                       headers=AUTH).status_code == 200
    back = online.post("/admin/rules/rollback", json={"version": longest}, headers=AUTH)
    assert back.status_code == 200 and back.json()["active"] == longest


def test_a_rule_set_the_catalog_cannot_judge_is_refused_before_publishing(online: TestClient,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def check(self: RulesStage, ruleset: object) -> None:
        raise RulesError("rule 'income_gate' (rules[0]): reads user attribute 'income', which this catalog lacks")

    monkeypatch.setattr(RulesStage, "check", check, raising=False)
    resp = put(online, "version: income-1\n" + ONE_RULE)
    assert resp.status_code == 422
    assert resp.json()["detail"] == ("rule 'income_gate' (rules[0]): reads user attribute 'income', "
                                     "which this catalog lacks")
    assert "income-1" not in published(online)


@pytest.mark.parametrize("kind", ["[blocklist]", "{a: 1}"])
def test_a_rule_kind_that_is_not_a_string_is_422_not_500(online: TestClient, kind: str) -> None:
    resp = put(online, f'version: "k"\nrules: [{{id: r, kind: {kind}, items: {{item_ids: [m6]}}}}]\n')
    assert resp.status_code == 422
    assert resp.json()["detail"].startswith("PUT /admin/rules: rule 'r' (rules[0]): kind must be one of [")
    assert "k" not in published(online)


def test_a_json_document_with_escaped_emoji_is_published_as_text(online: TestClient) -> None:
    doc = {"version": "emoji-1", "rules": [{"id": "note", "kind": "disclaimer", "items": {"item_ids": ["m6"]},
                                            "text": "Heads up 🙂"}], "acknowledge_dropped_gates": DEFAULT_GATES}
    resp = put(online, doc)  # json.dumps: ASCII, so the emoji travels as "\ud83d\ude42"
    assert resp.status_code == 200, resp.text
    assert "emoji-1" in published(online)
