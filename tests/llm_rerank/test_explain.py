"""Reasons for recommended items: schema-valid generation, the grounding check, the template fallback,
the cache and its prompt version, on the tiny random LLM (and a few on the real SmolLM2, slow)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cascade.settings import Settings
from llm_rerank.anchored import anchors_of, parse_reason, render_reason
from llm_rerank.config import ExplainConfig
from llm_rerank.explain import EvidenceBuilder, Reason, ReasonGenerator, ReasonWriter
from llm_rerank.grounding import ItemFacts, template_reason
from llm_rerank.reason_cache import MemoryReasonCache
from llm_rerank.stage import LLMRerankStage
from recsys.contract import Request
from tests.llm_rerank.factories import CONVERTED, save_tiny_llm, tiny_split

HISTORY = np.array([1, 2, 3, 4])  # Aladdin, The Lion King, Pinocchio, Cinderella: animation only
TOY_STORY, SCREAM = 0, 6


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("artifacts")
    save_tiny_llm(root / "tiny-llm")
    tiny_split().save(root / "toy" / "split")
    return root


def make_stage(artifacts: Path, model: str | None = None) -> LLMRerankStage:
    settings = Settings.build({"artifacts_dir": str(artifacts),
                               "llm": {"model": model or str(artifacts / "tiny-llm"), "precision": "fp32"}})
    stage = LLMRerankStage(None, settings.llm, artifacts_root=settings.artifacts_dir)
    stage.load(artifacts / "toy")
    return stage


@pytest.fixture(scope="module")
def facts() -> ItemFacts:
    return ItemFacts.from_items(tiny_split().items)


def writer(facts: ItemFacts, gen: ReasonGenerator | None, cfg: ExplainConfig | None = None) -> ReasonWriter:
    return ReasonWriter(EvidenceBuilder(facts), cfg or ExplainConfig(), "movie", MemoryReasonCache(100, 3600),
                        lambda: gen)


def request() -> Request:
    return Request(user_id="u0", history=HISTORY)


def test_every_generated_row_is_schema_valid_json(artifacts: Path, facts: ItemFacts) -> None:
    gen = ReasonGenerator(make_stage(artifacts), ExplainConfig(), "movie")
    evidence = EvidenceBuilder(facts).build(request(), [TOY_STORY, 5, SCREAM], [["two_tower"], ["popularity"], []])
    texts = gen.generate(request(), evidence, deadline=float("inf"))
    assert len(texts) == 3
    for text, ev in zip(texts, evidence, strict=True):
        parsed = parse_reason(text)
        assert parsed is not None, text
        because, why = parsed
        assert 1 <= because <= len(anchors_of(ev, gen.cfg.anchors))
        assert 10 <= len(why) <= gen.max_chars and why[1:] == why[1:].lower(), why


def test_the_model_can_name_only_the_anchors_it_is_offered(facts: ItemFacts) -> None:
    ev = EvidenceBuilder(facts).build(request(), [TOY_STORY], [["two_tower"]])[0]
    assert anchors_of(ev, 3) == (4, 3, 2)  # the most recent first without co-visitation neighbours
    assert parse_reason('{"because": 1, "why": "as in Scream, a slasher"}') is None  # a capital: a name
    assert parse_reason('{"because": 1, "why": "a classic from nineteen"}') == (1, "a classic from nineteen")
    assert parse_reason('{"because": 1, "why": "made in 1996"}') is None  # a digit: a year
    assert parse_reason('{"because": 0, "why": "another animated tale"}') is None
    w = writer(facts, None)
    assert w._judge(ev, '{"because": 2, "why": "another hand drawn fairy tale"}') == Reason(
        "Because you watched Pinocchio (1940), another hand drawn fairy tale.", "llm", schema_valid=True)
    beyond = w._judge(ev, '{"because": 4, "why": "another hand drawn fairy tale"}')
    assert (beyond.source, beyond.problems) == ("template", ("rests on item 4 of the 3 offered",))
    wrong = w._judge(ev, '{"because": 1, "why": "a horror film for a late night"}')
    assert (wrong.source, wrong.problems) == (
        "template", ("claims the category 'Horror', which neither the item nor the history has",))
    assert render_reason("Lion King, The (1994)", "More singing animals ,", "watched") == (
        "Because you watched The Lion King (1994), more singing animals.")
    stutter = w._judge(ev, '{"because": 1, "why": "a wcwcwcwcwcwc kind of tale"}')
    assert (stutter.source, stutter.problems) == ("template", ("stutters (a fragment four times over)",))
    cut = w._judge(ev, '{"because": 1, "why": "a story of courage and friendship told with warmth, humour and a little ma"}')
    assert cut.problems == ("is cut off (the clause reached its length limit)",)


def test_a_row_the_token_budget_cuts_is_still_closed_as_valid_json(artifacts: Path, facts: ItemFacts) -> None:
    gen = ReasonGenerator(make_stage(artifacts), ExplainConfig(max_new_tokens=20), "movie")
    evidence = EvidenceBuilder(facts).build(request(), [TOY_STORY, 5], [["two_tower"], ["popularity"]])
    texts = gen.generate(request(), evidence, deadline=float("inf"))
    assert all(parse_reason(t) is not None for t in texts), texts  # the random model never closes by itself


def test_a_reason_without_a_why_or_cut_off_is_refused(facts: ItemFacts) -> None:
    ev = EvidenceBuilder(facts).build(request(), [TOY_STORY], [["two_tower"]])[0]
    assert facts.check("1995", ev, 25) == ["has 1 words, fewer than 4: says no why"]
    assert facts.check("A favourite among fans of the", ev, 25) == ["is cut off (no sentence end)"]


def test_the_explanation_prompt_continues_the_rerankers_prefix(artifacts: Path, facts: ItemFacts) -> None:
    stage = make_stage(artifacts)
    gen = ReasonGenerator(stage, ExplainConfig(), "movie")
    evidence = EvidenceBuilder(facts).build(request(), [TOY_STORY], [["two_tower"]])
    prefix, suffixes = gen.rows(request(), evidence)
    assert prefix == stage.build_prompt(request(), np.array([TOY_STORY])).prefix  # one cached prefix for both
    assert len(suffixes) == 1


def test_grounding_rejects_a_title_outside_the_history(facts: ItemFacts) -> None:
    ev = EvidenceBuilder(facts).build(request(), [TOY_STORY], [["two_tower"]])[0]
    assert facts.check("Because you watched Aladdin and Scream.", ev, 25) == [
        "names 'Scream (1996)', which is not in the user's history"]
    assert facts.check("Because you watched Aladdin and The Lion King, another Toy Story.", ev, 25) == []


def test_grounding_rejects_a_category_or_year_the_data_does_not_carry(facts: ItemFacts) -> None:
    ev = EvidenceBuilder(facts).build(request(), [TOY_STORY], [["two_tower"]])[0]
    assert facts.check("A horror classic from 1995.", ev, 25) == [
        "claims the category 'Horror', which neither the item nor the history has"]
    assert facts.check("An animation classic from 1999.", ev, 25) == [
        "claims the year 1999, which the item's data does not carry"]
    assert facts.check("One two three four five six.", ev, 5) == ["has 6 words, more than 5"]


def test_a_common_word_is_not_read_as_a_one_word_title() -> None:
    facts = ItemFacts(["Heat (1995)", "Alien (1979)", "Up (2009)", "Game, The (1997)"], [[], [], [], []],
                      [1995, 1979, 2009, 1997], ["", "", "", ""])
    ev = EvidenceBuilder(facts).build(Request(user_id="u", history=np.array([2])), [1], [[]])[0]
    assert facts.check("It brings the heat, as Up did.", ev, 25) == []
    assert facts.check("Heat and tension: the game is on.", ev, 25) == []
    assert facts.check("As tense as The Game.", ev, 25) == ["names 'The Game (1997)', which is not in the user's history"]
    assert facts.check("It brings the Heat of Alien.", ev, 25) == [
        "names 'Heat (1995)', which is not in the user's history"]


def test_template_reasons_pass_the_check(facts: ItemFacts) -> None:
    builder = EvidenceBuilder(facts)
    cold = Request(user_id="new")
    for req in (request(), cold):
        for ev in builder.build(req, list(range(12)), [["popularity"]] * 12):
            reason = template_reason(ev, facts, "watched", "movie")
            assert facts.check(reason, ev, 25) == [], reason
    assert template_reason(builder.build(cold, [TOY_STORY], [["popularity"]])[0], facts, "watched",
                           "movie") == "Popular with new visitors."
    shared = builder.build(request(), [TOY_STORY], [["two_tower"]])[0]
    assert template_reason(shared, facts, "watched", "movie") == (
        "Because you watched Animation movies such as Cinderella (1950).")


def test_co_visitation_neighbours_name_the_history_items_nearest_the_item(facts: ItemFacts) -> None:
    from scipy import sparse

    w = sparse.lil_matrix((12, 12), dtype=np.float32)
    w[2, TOY_STORY], w[TOY_STORY, 4], w[1, TOY_STORY] = 5.0, 3.0, 1.0
    ev = EvidenceBuilder(facts, w.tocsr(), neighbours=2).build(request(), [TOY_STORY], [["covisit"]])[0]
    assert ev.neighbours == (2, 4)
    assert template_reason(ev, facts, "watched", "movie") == (
        "Because you watched The Lion King (1994) and Cinderella (1950).")


def test_a_budget_of_zero_serves_templates_without_generating(artifacts: Path, facts: ItemFacts) -> None:
    gen = ReasonGenerator(make_stage(artifacts), ExplainConfig(), "movie")
    w = writer(facts, gen)
    reasons = w.write(request(), [TOY_STORY, 5], [["two_tower"], ["two_tower"]], budget_s=0.0)
    assert [r.source for r in reasons] == ["template", "template"]
    assert all(r.text for r in reasons)
    assert w.cache is not None and len(w.cache) == 0  # an overrun is not cached: the model may answer next time


def test_a_generation_past_the_request_deadline_serves_templates(artifacts: Path, facts: ItemFacts) -> None:
    import time

    gen = ReasonGenerator(make_stage(artifacts), ExplainConfig(), "movie")
    late = Request(user_id="u0", history=HISTORY, deadline=time.monotonic() - 1.0)
    reasons = writer(facts, gen).write(late, [TOY_STORY], [["two_tower"]], budget_s=10.0)
    assert [r.source for r in reasons] == ["template"]


def test_a_failing_model_serves_templates(artifacts: Path, facts: ItemFacts) -> None:
    gen = ReasonGenerator(make_stage(artifacts), ExplainConfig(), "movie")
    gen.pad_id = 10**7  # rows of unequal length are padded with an id outside the embedding: the model raises
    reasons = writer(facts, gen).write(request(), [TOY_STORY, SCREAM], [["two_tower"], ["popularity", "covisit"]],
                                       budget_s=10.0)
    assert [r.source for r in reasons] == ["template", "template"]
    assert reasons[1].text == "Picked from what you watched recently, such as Cinderella (1950)."


def test_a_second_request_is_served_from_the_cache(artifacts: Path, facts: ItemFacts) -> None:
    gen = ReasonGenerator(make_stage(artifacts), ExplainConfig(), "movie")
    w = writer(facts, gen)
    first = w.write(request(), [TOY_STORY, 5], [["two_tower"], ["two_tower"]], budget_s=30.0)
    second = w.write(request(), [TOY_STORY, 5], [["two_tower"], ["two_tower"]], budget_s=30.0)
    assert [r.cached for r in first] == [False, False]
    assert [r.cached for r in second] == [True, True]
    assert [(r.text, r.source) for r in second] == [(r.text, r.source) for r in first]
    moved = w.write(Request(user_id="u0", history=HISTORY[:-1]), [TOY_STORY], [["two_tower"]], budget_s=30.0)
    assert [r.cached for r in moved] == [False]  # another history window: another key


def test_a_new_prompt_version_is_not_served_old_reasons(artifacts: Path, facts: ItemFacts) -> None:
    stage = make_stage(artifacts)
    gen = ReasonGenerator(stage, ExplainConfig(), "movie")
    w = writer(facts, gen)
    w.write(request(), [TOY_STORY], [["two_tower"]], budget_s=30.0)
    before = gen.version()
    stage.set_prompt_template({"explain_request": "Say in a few words why this {domain} fits."})
    assert gen.version() != before
    assert [r.cached for r in w.write(request(), [TOY_STORY], [["two_tower"]], budget_s=30.0)] == [False]
    stage.set_prompt_template({})  # back to the built-in document: its reasons are still cached
    assert gen.version() == before
    assert [r.cached for r in w.write(request(), [TOY_STORY], [["two_tower"]], budget_s=30.0)] == [True]


@pytest.mark.slow
@pytest.mark.skipif(not (CONVERTED / "config.json").exists(), reason="needs the converted SmolLM2 (make venv)")
def test_smollm2_writes_schema_valid_reasons_and_serves_only_checked_ones(artifacts: Path, facts: ItemFacts) -> None:
    gen = ReasonGenerator(make_stage(artifacts, str(CONVERTED)), ExplainConfig(), "movie")
    evidence = EvidenceBuilder(facts).build(request(), [TOY_STORY, 5], [["two_tower"], ["popularity"]])
    texts = gen.generate(request(), evidence, deadline=float("inf"))
    assert all(parse_reason(t) is not None for t in texts), texts
    for reason, ev in zip(writer(facts, gen).write(request(), [TOY_STORY, 5], [["two_tower"], ["popularity"]],
                                                   budget_s=120.0), evidence, strict=True):
        assert reason.source == "template" or facts.check(reason.text, ev, 25) == []


def test_a_clause_of_made_up_words_or_echoing_the_request_is_not_served(artifacts: Path, facts: ItemFacts) -> None:
    gen = ReasonGenerator(make_stage(artifacts), ExplainConfig(), "movie")
    ev = EvidenceBuilder(facts).build(request(), [TOY_STORY], [["two_tower"]])[0]
    w = writer(facts, gen)
    assert "animated" in gen.words() and "bacabacuad" not in gen.words()
    made_up = w._judge(ev, '{"because": 1, "why": "both are bacabacuad"}', gen)
    short = w._judge(ev, '{"because": 1, "why": "cinderella"}', gen)
    assert short.source == "template" and short.problems[0] == "says no why (a clause of fewer than 3 words)"
    titled = w._judge(ev, '{"because": 1, "why": "much like scream, a classic"}', gen)
    assert (titled.source, titled.problems) == ("template", ("names the title 'Scream (1996)' in its clause",))
    assert (made_up.source, made_up.problems) == ("template", ("is not a word: 'bacabacuad'",))
    echo = w._judge(ev, '{"because": 1, "why": "what the two have in common"}', gen)
    assert (echo.source, echo.problems) == ("template", ("echoes the request",))
    fine = w._judge(ev, '{"because": 2, "why": "another animated fairy tale"}', gen)
    assert fine.source == "llm", fine.problems
