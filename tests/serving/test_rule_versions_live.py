"""Answers under alternating publishes: every answer's items and disclaimers are those of its labelled version.

A real app (TestClient, the real rules stage on the toy catalog, result cache on): one thread
publishes rule set A (blocks m1) and B (a disclaimer on m2) in turn every 50 ms while four
threads ask for the unknown user "stranger", whose list under the default gates is m1 m2 m5 m6.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from tests.serving.conftest import ADMIN_KEY, REAL_RULES, client_for

AUTH = {"X-API-Key": ADMIN_KEY}
GATES = [{"id": "withdrawn_items", "kind": "blocklist", "items": {"item_ids": ["withdrawn-0001"], "unknown_ids": "allow"}},
         {"id": "adult_gate", "kind": "audience_gate", "audience": "adult", "min_age": 18},
         {"id": "teen_gate", "kind": "audience_gate", "audience": "teen", "min_age": 13},
         {"id": "risk_tolerance", "kind": "risk_tolerance", "default_tolerance": 1}]
RULES_A = {"version": "rules-a", "rules": [*GATES, {"id": "block_x", "kind": "blocklist", "items": {"item_ids": ["m1"]}}]}
RULES_B = {"version": "rules-b", "rules": [*GATES, {"id": "note_y", "kind": "disclaimer", "text": "B",
                                                    "items": {"item_ids": ["m2"]}}],
           "acknowledge_dropped_gates": ["blocklist:block_x"]}


def disagrees(answer: dict[str, Any]) -> bool:
    """Whether the answer's items or disclaimers are not those of the rule set it is labelled with."""
    version = answer["versions"]["rules"]
    items = {i["id"]: i["disclaimers"] for i in answer["items"]}
    if version == "rules-a":
        return "m1" in items or "B" in items.get("m2", [])
    if version == "rules-b":
        return "m1" not in items or items.get("m2") != ["B"]
    return True


def test_no_answer_mixes_rule_sets_under_publishes_every_50_ms(toy_dir: Path) -> None:
    with client_for(toy_dir, REAL_RULES, admin_api_key=ADMIN_KEY) as client:
        assert client.put("/admin/rules", content=json.dumps(RULES_A), headers=AUTH).status_code == 200
        stop = threading.Event()
        answers: list[dict[str, Any]] = []
        statuses: list[int] = []

        def publish() -> None:
            docs = [RULES_B, RULES_A]
            i = 0
            while not stop.is_set():
                statuses.append(client.put("/admin/rules", content=json.dumps(docs[i % 2]), headers=AUTH).status_code)
                i += 1
                time.sleep(0.05)

        def ask(n: int) -> None:
            for _ in range(n):
                resp = client.post("/v1/recommend", json={"user_id": "stranger", "k": 5})
                answers.append(resp.json())

        publisher = threading.Thread(target=publish)
        askers = [threading.Thread(target=ask, args=(400,)) for _ in range(4)]
        publisher.start()
        for t in askers:
            t.start()
        for t in askers:
            t.join()
        stop.set()
        publisher.join()
    assert set(statuses) == {200} and len(statuses) >= 4
    labels = [a["versions"]["rules"] for a in answers]
    assert {"rules-a", "rules-b"} <= set(labels)  # both versions were served meanwhile
    assert [a for a in answers if disagrees(a)] == []
