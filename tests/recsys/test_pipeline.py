"""Pipeline semantics: order, depths, skips, fallbacks on error/overrun, fail-closed stages."""

import time

import numpy as np
import pytest

from recsys.config import StageSpec
from recsys.contract import Candidates, Request
from recsys.pipeline import Pipeline, PipelineError, PipelineStage


class ListRecall:
    """Recall over a fixed catalog: item i scores -i (so lower ids first), history excluded."""

    name, reads, writes = "recall", (), ("recall",)

    def __init__(self, n_items: int = 30):
        self.n_items = n_items

    def load(self, artifact_dir) -> None: ...

    def version(self) -> str:
        return "list-v1"

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        items = np.setdiff1d(np.arange(self.n_items), request.excluded)
        return Candidates(items=items).with_scores("recall", -items.astype(np.float32))


class ParityScorer:
    """Puts odd items first; optionally raises or sleeps to exercise fallbacks."""

    reads, writes = ("recall",), ("coarse",)

    def __init__(self, name="coarse", fail=False, sleep_s=0.0):
        self.name, self.fail, self.sleep_s = name, fail, sleep_s

    def load(self, artifact_dir) -> None: ...

    def version(self) -> str:
        return "parity-v1"

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        if self.fail:
            raise RuntimeError("model exploded")
        time.sleep(self.sleep_s)
        return candidates.with_scores(self.name, (candidates.items % 2).astype(np.float32))


def spec(name, kind, **kw) -> StageSpec:
    return StageSpec(name=name, kind=kind, **kw)


def pipeline(second: ParityScorer, **kw) -> Pipeline:
    return Pipeline([(spec("recall", "recall", depth=10, on_error="fail"), ListRecall()),
                     (spec(second.name, "coarse", depth=4, **kw), second)])


def test_stages_run_in_order_with_depth_cuts_and_timings():
    res = pipeline(ParityScorer()).run(Request(user_id="u", k=3, history=[0, 1]))
    # recall keeps 2..11 (history excluded), parity puts odd first, stable within ties
    assert res.candidates.items.tolist() == [3, 5, 7]
    assert [(t.name, t.status, t.n_in, t.n_out) for t in res.traces] == [
        ("recall", "ok", 0, 10), ("coarse", "ok", 10, 4)]
    assert all(t.ms >= 0 for t in res.traces)
    assert res.versions == {"recall": "list-v1", "coarse": "parity-v1"}
    assert res.fallbacks == []


def test_exception_falls_back_to_previous_order_and_says_so():
    res = pipeline(ParityScorer(fail=True)).run(Request(user_id="u", k=3))
    assert res.candidates.items.tolist() == [0, 1, 2]
    trace = res.traces[-1]
    assert (trace.status, trace.n_out) == ("fallback", 4)
    assert "RuntimeError: model exploded" in trace.reason
    assert res.fallbacks == ["coarse"]


def test_budget_overrun_falls_back():
    res = pipeline(ParityScorer(sleep_s=0.05), budget_ms=1).run(Request(user_id="u", k=3))
    assert res.candidates.items.tolist() == [0, 1, 2]
    assert "budget overrun" in res.traces[-1].reason


def test_offline_jobs_run_the_same_stages_without_the_budgets():
    served = pipeline(ParityScorer(sleep_s=0.05), budget_ms=1)
    offline = served.without_budgets()
    res = offline.run(Request(user_id="u", k=3))
    assert res.candidates.items.tolist() == [1, 3, 5] and res.traces[-1].status == "ok"
    assert [st for _, st in offline.stages] == [st for _, st in served.stages] and offline.watchdog is served.watchdog
    assert served.stages[1][0].budget_ms == 1  # the served pipeline keeps its budgets
    assert PipelineStage(served).pipeline.stages[1][0].budget_ms is None


def test_stage_sees_its_own_deadline():
    seen = {}

    class Probe(ParityScorer):
        def run(self, request, candidates):
            seen["remaining"] = request.remaining_s()
            return super().run(request, candidates)

    pipeline(Probe(), budget_ms=500).run(Request(user_id="u"))
    assert 0 < seen["remaining"] <= 0.5


def test_fail_closed_stage_raises_pipeline_error():
    p = pipeline(ParityScorer(fail=True), on_error="fail")
    with pytest.raises(PipelineError, match="stage 'coarse' failed: RuntimeError: model exploded") as err:
        p.run(Request(user_id="u"))
    assert err.value.traces[-1].status == "error"


def test_disabled_and_policy_skipped_stages_are_reported():
    res = pipeline(ParityScorer(), enabled=False).run(Request(user_id="u", k=2))
    assert res.traces[-1].status == "skipped" and res.traces[-1].reason == "disabled"
    assert res.candidates.items.tolist() == [0, 1]
    res = pipeline(ParityScorer()).run(Request(user_id="u", k=2), skip={"coarse"})
    assert res.traces[-1].reason == "skipped by request policy"


def test_expired_request_deadline_skips_optional_stages():
    req = Request(user_id="u", k=2, deadline=time.monotonic() - 1)
    p = Pipeline([(spec("recall", "recall", depth=10, on_error="fail"), ListRecall()),
                  (spec("coarse", "coarse"), ParityScorer())])
    with pytest.raises(PipelineError, match="deadline"):
        p.run(req)


def test_until_stops_after_the_named_stage():
    res = pipeline(ParityScorer()).run(Request(user_id="u", k=5), until="recall")
    assert [t.name for t in res.traces] == ["recall"]
    assert res.candidates.items.tolist() == [0, 1, 2, 3, 4]


def test_observer_sees_every_stage_output():
    seen = []
    pipeline(ParityScorer()).run(Request(user_id="u", k=3), observe=lambda n, c: seen.append((n, len(c))))
    assert seen == [("recall", 10), ("coarse", 4)]


def test_pipeline_stage_returns_the_last_stage_output_uncut():
    from recsys.contract import Stage

    ps = PipelineStage(pipeline(ParityScorer()))
    assert isinstance(ps, Stage)
    out = ps.run(Request(user_id="u", k=1), Candidates.empty())
    assert out.items.tolist() == [1, 3, 5, 7]  # coarse depth 4, not request.k
    assert ps.version() == "recall:list-v1+coarse:parity-v1"


def test_required_stage_over_budget_keeps_its_output_and_flags_it():
    p = Pipeline([(spec("recall", "recall", depth=10, budget_ms=1, on_error="fail"), SlowRecall())])
    res = p.run(Request(user_id="u", k=2))
    assert res.candidates.items.tolist() == [0, 1]
    assert res.traces[0].status == "ok" and "budget overrun" in res.traces[0].reason


class SlowRecall(ListRecall):
    def run(self, request, candidates):
        time.sleep(0.01)
        return super().run(request, candidates)


class DropOdd:
    """A policy stage (kind ``rules``) that removes odd items, keeping the order."""

    name, reads, writes = "rules", (), ()

    def load(self, artifact_dir) -> None: ...

    def version(self) -> str:
        return "drop-odd"

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        return candidates.take(np.flatnonzero(candidates.items % 2 == 0))


class PopularRecall(ListRecall):
    """ListRecall whose ``more`` hands out the whole catalog, highest id first, 5 at a time."""

    def more(self, request: Request, size: int):
        order = np.setdiff1d(np.arange(self.n_items), request.excluded)[::-1]
        for start in range(0, len(order), 5):
            yield order[start:start + 5]


def policy_pipeline(recall=None, recall_depth=10) -> Pipeline:
    return Pipeline([(spec("recall", "recall", depth=recall_depth, on_error="fail"), recall or ListRecall()),
                     (spec("coarse", "coarse", depth=4), ParityScorer()),
                     (spec("rules", "rules", on_error="fail"), DropOdd())])


def test_rules_that_empty_the_list_are_backfilled_from_the_coarse_tail_first():
    # coarse puts odd items first: its top 4 (1, 3, 5, 7) are all removed by the policy
    result = policy_pipeline().run(Request(user_id="u", k=4))
    assert result.candidates.items.tolist() == [0, 2, 4, 6]  # coarse's cut-off tail, in coarse order
    assert result.complete and result.short_by == 0 and result.short_reason == ""
    assert result.candidates.flags["backfill"].all()
    assert np.isnan(result.candidates.scores["coarse"]).all()  # never ranked by the served order
    assert result.traces[-1].name == "backfill" and result.traces[-1].n_out == 4


def test_backfill_reaches_recall_then_more_and_obeys_the_policy():
    result = policy_pipeline().run(Request(user_id="u", k=8))
    # coarse tail (9, 0, 2, 4, 6, 8) -> 5 even items; recall tail (10..29 in recall order) -> 10, 12, 14
    assert result.candidates.items.tolist() == [0, 2, 4, 6, 8, 10, 12, 14] and result.complete
    deep = policy_pipeline(PopularRecall(n_items=40), recall_depth=40).run(Request(user_id="u", k=25))
    assert len(deep.candidates) == 20 and deep.short_by == 5  # only 20 even items exist
    assert deep.short_reason == "no more candidates pass the rules"
    more = Pipeline([(spec("recall", "recall", depth=6, on_error="fail"), PopularRecall(n_items=40)),
                     (spec("rules", "rules", on_error="fail"), DropOdd())])
    got = more.run(Request(user_id="u", k=8, history=np.array([38]))).candidates.items.tolist()
    # recall's own 0, 2, 4 then its tail (6..) comes first, then more(): 38 is excluded history
    assert got == [0, 2, 4, 6, 8, 10, 12, 14]


def test_a_list_that_cannot_be_filled_says_so():
    pipe = Pipeline([(spec("recall", "recall", on_error="fail"), ListRecall(n_items=6)),
                     (spec("rules", "rules", on_error="fail"), DropOdd())])
    result = pipe.run(Request(user_id="u", k=10))
    assert result.candidates.items.tolist() == [0, 2, 4]
    assert not result.complete and result.short_by == 7
    assert result.short_reason == "no more candidates pass the rules"


class HeadScorer(ParityScorer):
    """Scores only its first ``n`` candidates and hands back just those (as the LLM re-ranker does)."""

    def __init__(self, n: int):
        super().__init__(name="llm")
        self.n = n

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        return super().run(request, candidates.head(self.n))


def test_what_a_re_ranker_drops_is_backfilled_before_the_deeper_tails():
    # recall 0..29, cut to 10 (tail 10..29) -> the "llm" scores only 0 and 1 (odd first) and drops 2..9 -> rules
    pipe = Pipeline([(spec("recall", "recall", depth=10, on_error="fail"), ListRecall()),
                     (spec("llm", "llm", depth=2), HeadScorer(2)),
                     (spec("rules", "rules", on_error="fail"), DropOdd())])
    result = pipe.run(Request(user_id="u", k=3))
    # 1 falls to the rules; the llm's dropped 2..9 (in recall order) come before recall's tail 10..29
    assert result.candidates.items.tolist() == [0, 2, 4] and result.complete


def test_items_the_rules_kept_but_a_later_depth_cut_are_backfilled_first():
    # filters before the ranker: rules keep 0, 2, 4, 6, 8 of recall's 10; coarse keeps 3 and cuts 6 and 8
    pipe = Pipeline([(spec("recall", "recall", depth=10, on_error="fail"), ListRecall()),
                     (spec("rules", "rules", on_error="fail"), DropOdd()),
                     (spec("coarse", "coarse", depth=3), ParityScorer())])
    result = pipe.run(Request(user_id="u", k=6))
    # they used to count as judged: skipped for recall's tail (10, 12, 14) and a short list blamed on the rules
    assert result.candidates.items.tolist() == [0, 2, 4, 6, 8, 10] and result.complete
    assert result.traces[-1].reason == "3 items added from deeper candidates"


def test_a_list_the_catalog_cannot_fill_says_so_without_blaming_the_rules():
    pipe = Pipeline([(spec("recall", "recall", on_error="fail"), ListRecall(n_items=6)),
                     (spec("rules", "rules", on_error="fail"), ParityScorer(name="rules"))])
    result = pipe.run(Request(user_id="u", k=10, history=np.array([5])))
    assert result.candidates.items.tolist() == [1, 3, 0, 2, 4] and result.short_by == 5
    assert result.short_reason.startswith("no more candidates: every item the stages can reach")


class SlowDropOdd(DropOdd):
    def run(self, request: Request, candidates: Candidates) -> Candidates:
        time.sleep(0.1)  # the request deadline passes while the policy runs
        return super().run(request, candidates)


def test_backfill_stops_at_the_request_deadline():
    pipe = Pipeline([(spec("recall", "recall", depth=10, on_error="fail"), ListRecall()),
                     (spec("coarse", "coarse", depth=4), ParityScorer()),
                     (spec("rules", "rules", on_error="fail"), SlowDropOdd())])
    result = pipe.run(Request(user_id="u", k=4, deadline=time.monotonic() + 0.05))
    assert not result.complete
    assert result.short_reason == "request deadline reached while backfilling"


def test_until_and_full_lists_need_no_backfill():
    full = policy_pipeline().run(Request(user_id="u", k=4), until="coarse")
    assert full.candidates.items.tolist() == [1, 3, 5, 7] and full.complete
    assert all(t.name != "backfill" for t in full.traces)


class CountingDropOdd(DropOdd):
    """DropOdd that counts how often it judges each item."""

    def __init__(self):
        self.seen: dict[int, int] = {}

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        for i in candidates.items.tolist():
            self.seen[i] = self.seen.get(i, 0) + 1
        return super().run(request, candidates)


def test_backfill_never_judges_an_item_the_rules_already_removed():
    policy = CountingDropOdd()
    pipe = Pipeline([(spec("recall", "recall", depth=10, on_error="fail"), PopularRecall(n_items=40)),
                     (spec("rules", "rules", on_error="fail"), policy)])
    result = pipe.run(Request(user_id="u", k=25))  # only 20 even items: backfill reaches more()
    assert result.candidates.items.tolist() == list(range(0, 40, 2)) and result.short_by == 5
    served = set(result.candidates.items.tolist())
    # served items are re-run with each block (caps count them); a removed item is judged once
    assert all(n == 1 for i, n in policy.seen.items() if i not in served)
