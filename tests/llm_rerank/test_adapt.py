"""The LoRA adaptation job: examples from candidates, checkpoint/resume, merged model served."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cascade.registry import stage_context
from cascade.settings import Settings
from llm_rerank.adapt import build_examples, llm_valid_users, train_llm, zscore
from llm_rerank.stage import LLMRerankStage
from recsys.contract import Candidates, Request
from tests.llm_rerank.factories import ANIMATION, HORROR, PopularityStage, save_tiny_llm, tiny_split


def _train(split: Any, stage: Any, settings: Settings, artifact_dir: Path, **kwargs: Any) -> dict[str, Any]:
    """``train_llm`` with the settings' LLM config, artifacts root and seed, as ``jobs.train`` calls it."""
    return train_llm(split, stage, settings.llm, artifact_dir, artifacts_root=Path(settings.artifacts_dir),
                     seed=settings.seed, **kwargs)


def test_examples_hold_last_train_item_as_positive_and_candidates_as_negatives() -> None:
    split = tiny_split()
    stage = PopularityStage(split)
    for listwise in (True, False):
        examples = build_examples(split, stage, n_users=8, n_candidates=4, listwise=listwise, seed=0,
                                  positives="train")
        assert len(examples) == 8
        for ex in examples:
            seq = split.train_sequences[ex.user_idx]
            np.testing.assert_array_equal(ex.history, seq[:-1])
            assert ex.candidates[ex.target] == seq[-1] and len(set(ex.candidates.tolist())) == len(ex.candidates)
            assert not set(ex.candidates.tolist()) & set(ex.history.tolist())  # history excluded
            assert listwise or ex.target == 0


def test_listwise_examples_shuffle_candidates_unless_told_to_keep_the_stage_order() -> None:
    """The stage saw the training positives; its order would teach 'answer A' (see adapt's doc)."""
    split = tiny_split()
    stage = PopularityStage(split)
    shuffled = build_examples(split, stage, n_users=8, n_candidates=6, listwise=True, seed=0)
    kept = build_examples(split, stage, n_users=8, n_candidates=6, listwise=True, seed=0, keep_order=True)
    for ex, ref in zip(shuffled, kept, strict=True):
        assert sorted(ex.candidates.tolist()) == sorted(ref.candidates.tolist())
        ranked = stage.run(Request(user_id="u", k=6, history=ref.history), _empty()).items.tolist()
        in_rank_order = [i for i in ranked if i in ref.candidates.tolist()]
        if len(in_rank_order) == len(ref.candidates):  # the stage found the positive: its order is kept
            assert ref.candidates.tolist() == in_rank_order
    assert len({ex.target for ex in shuffled}) > 1
    assert any(ex.candidates.tolist() != ref.candidates.tolist() for ex, ref in zip(shuffled, kept, strict=True))


def test_valid_positives_come_from_a_fixed_user_share_in_the_stage_order() -> None:
    split = tiny_split()
    stage = PopularityStage(split)
    pool = llm_valid_users(split.n_users, 0.5, 0)
    assert len(pool) == 4 and np.array_equal(pool, llm_valid_users(split.n_users, 0.5, 0))
    examples = build_examples(split, stage, n_users=8, n_candidates=6, listwise=True, seed=0, positives="valid")
    assert sorted(ex.user_idx for ex in examples) == pool.tolist()
    for ex in examples:
        assert ex.candidates[ex.target] == split.valid[ex.user_idx]
        np.testing.assert_array_equal(ex.history, split.history(ex.user_idx, "valid"))
        ranked = stage.run(Request(user_id="u", k=6, history=ex.history), _empty()).items.tolist()
        if split.valid[ex.user_idx] in ranked:  # found by the stage: its order is kept
            assert ex.candidates.tolist() == [i for i in ranked if i in ex.candidates.tolist()]
    with pytest.raises(ValueError, match="positives"):
        build_examples(split, stage, n_users=8, n_candidates=6, listwise=True, seed=0, positives="test")
    with pytest.raises(ValueError, match="valid_share"):
        llm_valid_users(8, 1.0, 0)


def _settings(root: Path, model: str, scoring: str, **adapt: object) -> Settings:
    return Settings.build({"artifacts_dir": str(root), "llm": {
        "model": model, "scoring": scoring, "precision": "fp32", "candidates": 4,
        "adapt": {"users": 8, "candidates": 4, "negatives": 2, "batch_size": 2, "checkpoint_every": 1,
                  "autocast_bf16": False, "positives": "train", **adapt}}})


def _served(settings: Settings) -> LLMRerankStage:
    """The LLM stage as the pipeline builds it from ``settings``."""
    return LLMRerankStage(None, settings.llm, **stage_context("llm", settings))


@pytest.mark.parametrize(("scoring", "arch"), [("listwise", "llama"), ("pointwise", "llama"), ("listwise", "qwen2"),
                                               ("listwise", "gemma3")])
def test_train_checkpoints_resumes_and_serves_merged_model(tmp_path: Path, scoring: str, arch: str) -> None:
    """Every packaged backbone architecture (SmolLM2, Qwen2.5, Gemma 3) adapts, resumes and serves merged."""
    model_dir = save_tiny_llm(tmp_path / "tiny", arch=arch)
    split = tiny_split()
    split.save(tmp_path / "toy" / "split")
    first = _train(split, PopularityStage(split), _settings(tmp_path, str(model_dir), scoring, max_steps=2),
                      tmp_path / "toy", progress=False)
    assert first["resumed_from"] == 0 and first["steps_run"] == 2 and all(np.isfinite(first["losses"]))
    ckpts = sorted((tmp_path / "toy" / "llm" / "checkpoints").glob("step-*.pt"))
    assert [c.name for c in ckpts] == ["step-000001.pt", "step-000002.pt"]
    second = _train(split, PopularityStage(split), _settings(tmp_path, str(model_dir), scoring),
                       tmp_path / "toy", progress=False)
    assert second["resumed_from"] == 2 and second["steps"] == 4 and second["steps_run"] == 2
    meta = json.loads((tmp_path / "toy" / "llm" / "train_meta.json").read_text())
    assert meta["scoring"] == scoring and meta["steps"] == 4
    stage = _served(_settings(tmp_path, str(model_dir), scoring))
    stage.load(tmp_path / "toy")
    assert stage.model_location == str(tmp_path / "toy" / "llm")
    out = stage.run(Request(user_id="u0", history=np.array([1, 2])), PopularityStage(split).run(
        Request(user_id="u0", k=20, history=np.array([1, 2])), _empty()))
    assert len(out) == 4 and np.isfinite(out.scores["llm"]).all()


def test_zscore_standardises_per_request_and_handles_nan_and_constants() -> None:
    z = zscore(np.array([3.0, 1.0, 2.0]))
    np.testing.assert_allclose(z, [1.2247449, -1.2247449, 0.0], rtol=1e-6)
    assert zscore(np.array([np.nan, 1.0, 3.0]))[0] == zscore(np.array([np.nan, 1.0, 3.0]))[1]  # NaN = lowest
    assert zscore(np.array([2.0, 2.0])).tolist() == [0.0, 0.0]
    assert zscore(np.array([np.nan, np.nan])).tolist() == [0.0, 0.0] and len(zscore(np.zeros(0))) == 0


def test_prior_only_beta_fits_the_stage_order() -> None:
    from llm_rerank.adapt import Example, fit_prior_beta

    informative = [Example(0, np.zeros(0), np.arange(3), 0, np.array([1.0, 0.0, -1.0], dtype=np.float32))] * 4
    fit = fit_prior_beta(informative)
    assert fit["beta"] == 8.0 and fit["loss"] < fit["uniform_loss"] == pytest.approx(np.log(3))  # always right
    useless = [Example(0, np.zeros(0), np.arange(3), t, np.array([1.0, 0.0, -1.0], dtype=np.float32)) for t in range(3)]
    assert fit_prior_beta(useless)["beta"] == 0.0
    with pytest.raises(ValueError, match="prior"):
        fit_prior_beta([Example(0, np.zeros(0), np.arange(3), 0)])


def test_residual_examples_carry_the_stage_prior_a_missed_positive_that_of_its_slot() -> None:
    split = tiny_split()
    stage = PopularityStage(split)
    examples = build_examples(split, stage, n_users=8, n_candidates=4, listwise=True, seed=0, positives="valid")
    missed = 0
    for ex in examples:
        got = stage.run(Request(user_id="u", k=4, history=ex.history), _empty())
        ranked = got.items[:4].tolist()
        by_item = dict(zip(got.items.tolist(), got.scores["coarse"].tolist(), strict=True))
        raw = np.array([by_item.get(int(i), np.nan) for i in ex.candidates])
        if int(ex.candidates[ex.target]) not in ranked:  # inserted at a random slot: that slot's score
            missed += 1
            raw[ex.target] = by_item[ranked[min(ex.target, len(ranked) - 1)]]
        assert ex.prior is not None and len(ex.prior) == len(ex.candidates)
        np.testing.assert_allclose(ex.prior, zscore(raw), rtol=1e-6)
        assert np.all(np.diff(ex.prior) <= 1e-6)  # the prior follows the shown order, positive included
    assert missed > 0  # the case that matters is exercised
    pointwise = build_examples(split, stage, n_users=8, n_candidates=3, listwise=False, seed=0, positives="valid")
    assert all(ex.prior is None for ex in pointwise)


def test_residual_training_learns_beta_resumes_it_and_serves_letters_plus_beta_z(tmp_path: Path) -> None:
    model_dir = save_tiny_llm(tmp_path / "tiny")
    split = tiny_split()
    split.save(tmp_path / "toy" / "split")
    settings = _settings(tmp_path, str(model_dir), "listwise", residual=True, max_steps=2, lr=0.05)
    first = _train(split, PopularityStage(split), settings, tmp_path / "toy", progress=False)
    fit = first["prior_only"]
    assert fit["loss"] <= fit["uniform_loss"] and first["residual_beta"] != fit["beta"]  # learnt from the fit
    with pytest.raises(ValueError, match="residual"):  # a plain run cannot resume a residual checkpoint
        _train(split, PopularityStage(split), _settings(tmp_path, str(model_dir), "listwise"), tmp_path / "toy",
                  progress=False)
    second = _train(split, PopularityStage(split), _settings(tmp_path, str(model_dir), "listwise", residual=True,
                                                                lr=0.05), tmp_path / "toy", progress=False)
    assert second["resumed_from"] == 2 and second["residual_beta"] != first["residual_beta"]
    stage = _served(_settings(tmp_path, str(model_dir), "listwise"))
    stage.load(tmp_path / "toy")
    assert stage.residual_beta == pytest.approx(second["residual_beta"])
    request = Request(user_id="u0", history=np.array([1, 2]))
    incoming = PopularityStage(split).run(dataclasses.replace(request, k=20), _empty())
    out = stage.run(request, incoming)
    top = incoming.head(4)
    expected = stage.score(request, top.items) + stage.residual_beta * zscore(top.scores["coarse"])
    got = dict(zip(out.items.tolist(), out.scores["llm"].tolist(), strict=True))  # out is sorted by llm
    np.testing.assert_allclose([got[int(i)] for i in top.items], expected, rtol=1e-5)
    with pytest.raises(ValueError, match="listwise"):
        _train(split, PopularityStage(split), _settings(tmp_path / "pw", str(model_dir), "pointwise",
                                                           residual=True), tmp_path / "pw", progress=False)


class _OtherGenreStage(PopularityStage):
    """Negatives of the other genre only: the user's unseen same-genre title is neither taught as
    a negative nor shown, so the tiny task says one thing ("same genre as the history")."""

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        out = super().run(dataclasses.replace(request, k=12), candidates)
        horror_user = int(request.history[0]) >= 6  # items 0-5 are animation, 6-11 horror
        return out.take(np.flatnonzero([(int(i) >= 6) != horror_user for i in out.items]))


def _empty():  # noqa: ANN202
    from recsys.contract import Candidates

    return Candidates.empty()


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("HEAVY_TESTS") != "1",
    reason="real SmolLM2 adaptation (~100 s) does not pass yet: measured 12/16 wins (needs 14) after 24 pointwise "
    "steps (the loss only reaches the Yes base rate; also 12/16 with 5 negatives), 10/16 after 40 at lr 2e-3, "
    "14/16 or 6/16 after 48 at lr 5e-3 depending on the run (unstable), 8/16 listwise; run it with "
    "HEAVY_TESTS=1 (make test-heavy)",
)
def test_real_smollm2_learns_genre_preference(tmp_path: Path) -> None:
    """After a few dozen LoRA steps on one-genre users, a same-genre title outranks the other genre."""
    pytest.importorskip("peft")
    split = tiny_split()
    split.save(tmp_path / "toy" / "split")
    settings = Settings.build({"artifacts_dir": str(Path(__file__).resolve().parents[2] / "artifacts"), "llm": {
        "scoring": "pointwise", "candidates": 4, "precision": "fp32",
        "adapt": {"users": 8, "negatives": 2, "epochs": 6, "batch_size": 2, "lr": 1e-3,
                  "checkpoint_every": 100, "positives": "train"}}})
    report = _train(split, _OtherGenreStage(split), settings, tmp_path / "toy", progress=False)
    assert report["steps"] == 24
    stage = _served(settings)
    stage.load(tmp_path / "toy")
    wins = 0
    for u in range(8):
        genre, other = (ANIMATION, HORROR) if u < 4 else (HORROR, ANIMATION)
        held = int(split.valid[u])
        wrong = split.items["title"].tolist().index(other[u % 4])
        history = split.train_sequences[u]
        for cands in ([held, wrong], [wrong, held]):  # both positions: no letter bias can pass alone
            scores = stage.score(Request(user_id=f"u{u}", history=history), np.array(cands))
            wins += int(scores[cands.index(held)] > scores[cands.index(wrong)])
    assert genre and wins >= 14, f"relevant title won only {wins}/16 comparisons"
