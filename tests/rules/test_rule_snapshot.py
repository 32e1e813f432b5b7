"""One rule set per answer: a request pins its rules stages once, whatever is published meanwhile."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cascade.registry import build_stage
from recsys.config import StageSpec
from recsys.contract import Candidates, Request
from recsys.pipeline import Pipeline
from rules.schema import RuleSet, parse_ruleset
from rules.stage import RulesStage
from serving.document_reload import RulesApplier
from tests.serving.toy import PopularityRecall, save_toy_split, toy_settings

RECALL = StageSpec(name="recall", kind="recall", on_error="fail")
FILTERS = StageSpec(name="rules", kind="rules", on_error="fail", params={"apply": "filters"})
MIDDLE = StageSpec(name="coarse", kind="coarse")
CAPS = StageSpec(name="caps", kind="rules", on_error="fail", params={"apply": "caps"})
BLOCK_M1 = parse_ruleset({"version": "block-m1", "rules": [
    {"id": "block_x", "kind": "blocklist", "items": {"item_ids": ["m1"]}}]})
NOTE_M2 = parse_ruleset({"version": "note-m2", "rules": [
    {"id": "note_y", "kind": "disclaimer", "text": "B's note", "items": {"item_ids": ["m2"]}}]})


class PublishLandsHere:
    """A pass-through stage between the filters and the caps that installs ``ruleset`` in every rules
    stage while the request runs: what a publish landing mid-request does."""

    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    name = "coarse"

    def __init__(self) -> None:
        self.applier: RulesApplier | None = None
        self.ruleset: RuleSet | None = None

    def load(self, artifact_dir: Any) -> None:
        """Nothing to load."""

    def version(self) -> str:
        return "pass-through"

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        if self.applier is not None and self.ruleset is not None:
            self.applier.install(self.ruleset.version, self.ruleset)
            self.ruleset = None
        return candidates


class CountingRules(RulesStage):
    pins = 0

    def pinned(self) -> Any:
        self.pins += 1
        return super().pinned()


def pipeline(tmp_path: Path) -> tuple[Pipeline, PublishLandsHere]:
    save_toy_split(tmp_path)
    settings = toy_settings(RECALL, FILTERS, MIDDLE, CAPS)
    recall = build_stage(RECALL, settings, cls=PopularityRecall)
    recall.load(tmp_path)
    middle = PublishLandsHere()
    stages: list[tuple[StageSpec, Any]] = [(RECALL, recall)]
    for spec in (FILTERS, CAPS):
        stage = build_stage(spec, settings, cls=CountingRules)
        stage.load(tmp_path)
        stages.append((spec, stage))
    stages.insert(2, (MIDDLE, middle))
    pipe = Pipeline(stages)
    applier = RulesApplier(pipe)
    applier.install(BLOCK_M1.version, BLOCK_M1)
    middle.applier = applier
    return pipe, middle


def served(pipe: Pipeline, result: Any) -> tuple[list[int], dict[int, list[str]]]:
    return result.candidates.items.tolist(), result.candidates.disclaimers


def test_a_publish_landing_mid_request_does_not_change_that_answer_or_its_label(tmp_path: Path) -> None:
    pipe, middle = pipeline(tmp_path)
    m1, m2 = 0, 1  # item_idx of m1 and m2 in the toy split
    request = Request(user_id="stranger", user_attrs={"age": 30}, k=5)
    middle.ruleset = NOTE_M2
    result = pipe.run(request)
    items, notes = served(pipe, result)
    assert (result.versions["rules"], result.versions["caps"]) == ("block-m1", "block-m1")  # the version that ran
    assert m1 not in items and m2 in items and notes.get(m2, []) == []  # block-m1's answer, whole
    after = pipe.run(request)  # the next request runs the published set, whole too
    items, notes = served(pipe, after)
    assert (after.versions["rules"], after.versions["caps"]) == ("note-m2", "note-m2")
    assert m1 in items and notes[m2] == ["B's note"]


def test_each_rules_stage_is_pinned_once_per_request(tmp_path: Path) -> None:
    pipe, _ = pipeline(tmp_path)
    request = Request(user_id="stranger", user_attrs={"age": 30}, k=2)
    filters, caps = pipe.stage("rules"), pipe.stage("caps")
    pipe.run(request)  # k=2 with m1 blocked: a full list, no backfill
    assert (filters.pins, caps.pins) == (1, 1)  # type: ignore[attr-defined]
    snapshot = pipe.snapshot()
    pipe.run(request, snapshot=snapshot)  # the caller's snapshot: nothing pinned again
    assert (filters.pins, caps.pins) == (2, 2)  # type: ignore[attr-defined]
    assert snapshot.versions == {"recall": pipe.stage("recall").version(), "rules": "block-m1",
                                 "coarse": "pass-through", "caps": "block-m1"}
