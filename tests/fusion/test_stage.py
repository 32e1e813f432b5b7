"""Fusion: rank normalisation, weight renormalisation over present stages, NaN handling, tuning."""

import json

import numpy as np
import pytest
from pydantic import ValidationError

from cascade.registry import weights_key
from cascade.settings import Settings
from fusion.stage import (
    FusionConfig,
    FusionStage,
    rank_normalise,
    save_weights,
)
from recsys.config import StageSpec
from recsys.contract import Candidates, Request, Stage

ITEMS = np.array([10, 11, 12, 13])
RECALL = np.array([4, 3, 2, 1], dtype=np.float32)  # normalised: 1, 2/3, 1/3, 0
COARSE = np.array([1, 4, 3, 2], dtype=np.float32)  # normalised: 0, 1, 2/3, 1/3
LLM = np.array([np.nan, 1, np.nan, 5], dtype=np.float32)  # normalised: 0, 2/3, 0, 1
WEIGHTS = {"recall": 0.2, "coarse": 0.3, "llm": 0.5}


def stage(depth=None, **params) -> FusionStage:
    return FusionStage(StageSpec(name="fusion", kind="fusion", depth=depth, params=params), FusionConfig(),
                       weights_key=weights_key(Settings.build({})))


def cands(**cols) -> Candidates:
    return Candidates(items=ITEMS, scores=cols, order_by="recall")


def test_linear_rank_normalisation_by_hand():
    assert rank_normalise(np.array([3.0, 1.0, np.nan, 2.0])).tolist() == pytest.approx([1, 1 / 3, 0, 2 / 3])
    assert rank_normalise(np.array([2.0, 2.0, 1.0])).tolist() == [0.75, 0.75, 0.0]  # ties share rank 0.5
    assert rank_normalise(np.array([7.0])).tolist() == [1.0]
    assert rank_normalise(np.array([np.nan, np.nan])).tolist() == [0.0, 0.0]
    assert rank_normalise(np.zeros(0)).tolist() == []


def test_rrf_normalisation_by_hand():
    got = rank_normalise(np.array([3.0, 1.0, np.nan, 2.0]), "rrf", rrf_k=1.0)  # (c+1)/(c+r+1), ranks 0,2,3,1
    assert got.tolist() == pytest.approx([1.0, 0.5, 0.4, 2 / 3])


def test_all_stages_fused_with_weights_by_hand():
    out = stage(weights=WEIGHTS).run(Request(user_id="u", k=10), cands(recall=RECALL, coarse=COARSE, llm=LLM))
    # 10: .2*1 = .2; 11: .2*2/3+.3+.5*2/3 = .7667; 12: .2/3+.3*2/3 = .2667; 13: .3/3+.5 = .6
    assert out.items.tolist() == [11, 13, 12, 10]
    assert out.scores["final"].tolist() == pytest.approx([0.76667, 0.6, 0.26667, 0.2], abs=1e-5)
    assert out.order_by == "final"
    assert out.scores["coarse"].tolist() == [4, 2, 3, 1]  # other columns stay aligned


@pytest.mark.parametrize("llm", [None, np.full(4, np.nan, dtype=np.float32)], ids=["absent", "all-nan"])
def test_missing_stage_renormalises_the_remaining_weights(llm):
    cols = {"recall": RECALL, "coarse": COARSE} | ({} if llm is None else {"llm": llm})
    out = stage(weights=WEIGHTS).run(Request(user_id="u"), cands(**cols))
    # weights become recall .4, coarse .6: 10: .4; 11: .4*2/3+.6; 12: .4/3+.6*2/3; 13: .6/3
    assert out.items.tolist() == [11, 12, 10, 13]
    assert out.scores["final"].tolist() == pytest.approx([0.86667, 0.53333, 0.4, 0.2], abs=1e-5)


def test_no_weighted_stage_keeps_the_current_order():
    out = stage(weights={"llm": 1.0}).run(Request(user_id="u"), cands(recall=RECALL, coarse=COARSE))
    assert out.items.tolist() == ITEMS.tolist()
    assert out.scores["final"].tolist() == pytest.approx([1, 2 / 3, 1 / 3, 0])


def test_keeps_every_candidate_for_later_caps_and_handles_empty():
    # fusion only reorders: the pipeline applies depths and request.k, and a caps stage
    # after fusion needs the whole fused order to fill k after dropping over-cap items
    full = cands(recall=RECALL, coarse=COARSE, llm=LLM)
    out = stage(weights=WEIGHTS).run(Request(user_id="u", k=3), full)
    assert len(out) == 4 and out.items[:2].tolist() == [11, 13]
    assert len(stage().run(Request(user_id="u"), Candidates.empty())) == 0


def test_stage_interface_weights_file_and_version(tmp_path):
    s = stage()
    assert isinstance(s, Stage) and s.writes == ("final",)
    assert s.config.weights is None and FusionConfig().weights is None
    s.load(tmp_path)  # nothing tuned for this pipeline: the most refined stage's order alone
    assert not s.tuned
    assert s.run(Request(user_id="u"), cands(recall=RECALL, coarse=COARSE)).items.tolist() == [11, 12, 13, 10]
    default_version = s.version()
    # the default pipeline has the LLM disabled: weights are looked up under "recall+coarse-<digest>"
    assert s.weights_key.startswith("recall+coarse-") and s.weights_key == weights_key(Settings.build({}))
    save_weights(tmp_path / "fusion" / "recall+coarse", {"recall": 1.0}, ndcg_at_10=0.1)
    s.load(tmp_path)  # weights under another key (older layout, other rules/depths) are not this pipeline's
    assert s.version() == default_version and not s.tuned
    save_weights(tmp_path / "fusion" / s.weights_key, {"recall": 0.7, "coarse": 0.3}, ndcg_at_10=0.5)
    assert json.loads((tmp_path / "fusion" / s.weights_key / "weights.json").read_text())["ndcg_at_10"] == 0.5
    s.load(tmp_path)
    assert s.config.weights == {"recall": 0.7, "coarse": 0.3} and s.tuned
    assert s.version() != default_version and len(s.version()) == 12
    assert s.run(Request(user_id="u"), cands(recall=RECALL, coarse=COARSE)).items.tolist() == [11, 10, 12, 13]


def test_without_tuned_weights_the_most_refined_scored_stage_serves():
    s = stage()
    assert s.run(Request(user_id="u"), cands(recall=RECALL, coarse=COARSE, llm=LLM)).items.tolist() == [13, 11, 10, 12]
    # the LLM fell back for this request (all NaN): coarse is the most refined stage that scored
    nan = np.full(4, np.nan, dtype=np.float32)
    assert s.run(Request(user_id="u"), cands(recall=RECALL, coarse=COARSE, llm=nan)).items.tolist() == [11, 12, 13, 10]
    assert s.run(Request(user_id="u"), cands(recall=RECALL)).items.tolist() == [10, 11, 12, 13]


def test_weights_key_follows_stages_depths_and_rule_sets(tmp_path):
    on = Settings.build({"pipeline": {"stages": [
        {"name": "recall", "kind": "recall", "on_error": "fail"}, {"name": "coarse", "kind": "coarse"},
        {"name": "llm", "kind": "llm"}, {"name": "fusion", "kind": "fusion"}]}})
    base = weights_key(Settings.build({}))
    assert weights_key(on).startswith("recall+coarse+llm-") and base.startswith("recall+coarse-")
    assert weights_key(Settings.build({})) == base  # deterministic
    deeper = Settings.build({})
    deeper.pipeline.stages[1] = deeper.pipeline.stages[1].model_copy(update={"depth": 100})
    assert weights_key(deeper) != base
    tagged = Settings.build({})  # coarse served from coarse_tags/: its scores differ, so do its weights
    tagged.pipeline.stages[1] = tagged.pipeline.stages[1].model_copy(update={"params": {"subdir": "coarse_tags"}})
    assert weights_key(tagged) not in (base, weights_key(deeper))
    mine = tmp_path / "mine.yaml"
    mine.write_text("version: m-1\nrules:\n  - {id: x, kind: blocklist, items: {item_ids: ['1']}}\n")
    other_rules = weights_key(Settings.build({"rules": {"ruleset": str(mine)}}))
    assert other_rules != base
    mine.write_text("version: m-1\nrules:\n  - {id: x, kind: blocklist, items: {item_ids: ['2']}}\n")
    assert weights_key(Settings.build({"rules": {"ruleset": str(mine)}})) != other_rules  # same version, new rules


def test_invalid_weights_are_refused_by_name(tmp_path):
    with pytest.raises(ValidationError, match="weight of 'llm' must be a finite number >= 0"):
        FusionConfig(weights={"recall": 1.0, "llm": -0.5})
    with pytest.raises(ValidationError, match="at least one weight must be > 0"):
        FusionConfig(weights={"recall": 0.0})
    with pytest.raises(ValidationError):
        save_weights(tmp_path, {"recall": float("nan")})
    assert not (tmp_path / "weights.json").exists()


def test_stage_serves_the_checked_weights_unless_told_to_take_the_grid_best(tmp_path):
    key = weights_key(Settings())
    save_weights(tmp_path / "fusion" / key, {"coarse": 1.0}, grid_best={"recall": 0.3, "coarse": 0.7})
    spec = StageSpec(name="fusion", kind="fusion")
    checked = FusionStage(spec, FusionConfig(), weights_key=key)
    checked.load(tmp_path)
    assert checked.config.weights == {"coarse": 1.0}
    grid = FusionStage(spec, FusionConfig(tuned="grid_best"), weights_key=key)
    grid.load(tmp_path)
    assert grid.config.weights == {"recall": 0.3, "coarse": 0.7}
