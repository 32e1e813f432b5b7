"""Two-tower training on a hand-made successor dataset: it must learn what popularity cannot."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from offline.metrics import per_user_metrics, rank_full, summarize
from recall.artifacts import MODEL_FILE, SPEC_FILE, VECTORS_FILE
from recall.config import EARLY_STOPPED_DIR, RecallConfig
from recall.fit import Run
from recall.stage import RecallStage
from recall.train import train_two_tower
from recsys.config import StageSpec
from recsys.contract import Candidates, Request
from tests.recall.two_tower_factories import successor_split, tiny_config, valid_only_split


@pytest.fixture(scope="module")
def split():
    return successor_split()


@pytest.mark.parametrize("loss", ["full", "sampled"])
def test_learns_the_successor_and_beats_popularity(split, tmp_path: Path, loss: str):
    report = train_two_tower(split, tmp_path, tiny_config(loss=loss, n_negatives=16), progress=False)
    assert report["loss"] == loss
    # Every user's next item is the successor of their last one: a sequence model ranks it first.
    assert report["valid"]["ndcg@10"] >= 0.95
    assert report["test"]["recall@10"] >= 0.95
    pop = split.item_popularity("valid")
    hist = split.train_sequences
    pop_rank = rank_full(np.tile(pop, (split.n_users, 1)), hist, 10)
    pop_ndcg = summarize(per_user_metrics(pop_rank, split.valid, 10))["ndcg@10"]
    assert pop_ndcg < 0.5 < report["valid"]["ndcg@10"]
    for name in (MODEL_FILE, SPEC_FILE, VECTORS_FILE, "index/index.faiss", "report.json"):
        assert (tmp_path / name).is_file(), name
    vectors = np.load(tmp_path / VECTORS_FILE)
    assert vectors.shape == (split.n_items, 16)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert json.loads((tmp_path / SPEC_FILE).read_text())["n_items"] == split.n_items
    # the default channels train from this in-memory split (nothing saved under tmp_path.parent)
    assert not (tmp_path.parent / "split").exists()
    assert set(report["channels"]["shares"]) == {"covisit", "item_model"}
    assert (tmp_path / "channels.json").is_file() and (tmp_path / "channels" / "covisit.npz").is_file()


def test_same_seed_same_model(split, tmp_path: Path):
    cfg = tiny_config(max_epochs=3, eval_every=3)
    train_two_tower(split, tmp_path / "a", cfg, progress=False, seed=7)
    train_two_tower(split, tmp_path / "b", cfg, progress=False, seed=7)
    train_two_tower(split, tmp_path / "c", cfg, progress=False, seed=8)
    a, b, c = (np.load(tmp_path / d / VECTORS_FILE) for d in "abc")
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_same_seed_same_model_on_two_threads(tmp_path: Path):
    # Big enough that the backward of advanced indexing (index_put_ with accumulate) splits its
    # work across threads: without deterministic kernels two of three fits differed by ~1e-7.
    split = successor_split(n_items=200, n_users=400, length=20)
    cfg = tiny_config(max_epochs=2, eval_every=2, train_threads=2, dim=32, max_len=16, batch_size=64)
    for run in "abc":
        train_two_tower(split, tmp_path / run, cfg, progress=False, seed=7)
    a, b, c = (np.load(tmp_path / d / VECTORS_FILE) for d in "abc")
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)


def test_explicit_sequences_and_targets(split, tmp_path: Path):
    # The held-out copy (recall_holdout): train without each user's last train item, early-stop on it.
    seqs = [s[:-1] for s in split.train_sequences]
    targets = np.array([s[-1] for s in split.train_sequences])
    report = train_two_tower(split, tmp_path, tiny_config(), sequences=seqs, early_stop_targets=targets,
                             progress=False)
    assert "test" not in report  # test figures only for the default protocol data
    assert report["valid"]["recall@10"] >= 0.95
    with pytest.raises(ValueError, match="one sequence and one target per user"):
        train_two_tower(split, tmp_path, tiny_config(), sequences=seqs[:3], progress=False)


@pytest.mark.parametrize("loss", ["full", "sampled"])
def test_an_item_no_sequence_holds_is_not_trained_as_a_negative(split, tmp_path: Path, loss: str):
    # item 0 is dropped from every training sequence (a new item): its id embedding must never
    # move, and its vector must be what its content alone gives
    import torch

    from recall.features import ItemFeatures
    from recall.towers import ItemTower

    seqs = [s[s != 0] for s in split.train_sequences]
    targets = np.array([s[-1] if len(s) else -1 for s in seqs])
    cfg = tiny_config(loss=loss, n_negatives=16, max_epochs=2, eval_every=1)
    train_two_tower(split, tmp_path, cfg, sequences=[s[:-1] for s in seqs], early_stop_targets=targets,
                    progress=False)
    state = torch.load(tmp_path / MODEL_FILE, weights_only=True)["item_tower"]
    tower = ItemTower(ItemFeatures.from_items(split.items, None), cfg.dim, known=np.zeros(split.n_items, bool))
    tower.load_state_dict(state)
    with torch.no_grad():
        content_only = tower.eval().all_items().numpy()
    np.testing.assert_allclose(np.load(tmp_path / VECTORS_FILE)[0], content_only[0], atol=1e-5)


def test_the_logit_budget_stops_at_the_same_step_whatever_the_clock(split, tmp_path: Path, monkeypatch):
    # the budget counts target positions x items scored, so a fit stops at the same step, and with the
    # same weights, on a machine whatever its load; here every step "takes" 50 s of wall clock
    n_items = split.n_items
    cfg = tiny_config(max_train_logits=5 * 32 * 8 * n_items, max_epochs=50, eval_every=1, max_train_s=1e6)
    quiet = train_two_tower(split, tmp_path / "quiet", cfg, progress=False)
    clock = iter(range(0, 10**9, 50))
    monkeypatch.setattr(time, "perf_counter", lambda: float(next(clock)))
    busy = train_two_tower(split, tmp_path / "busy", cfg, progress=False)
    for report in (quiet, busy):
        assert report["out_of_budget"] and not report["out_of_time"]
        assert cfg.max_train_logits <= report["logits"] < cfg.max_train_logits + 32 * 8 * n_items  # one step past
    assert quiet["steps"] == busy["steps"] and quiet["epochs"] == busy["epochs"]
    np.testing.assert_array_equal(np.load(tmp_path / "quiet" / VECTORS_FILE), np.load(tmp_path / "busy" / VECTORS_FILE))


def test_the_sampled_softmax_budget_counts_the_negatives_not_the_catalog(split, tmp_path: Path):
    cfg = tiny_config(loss="sampled", n_negatives=16, max_train_logits=1.0, max_epochs=5)
    report = train_two_tower(split, tmp_path, cfg, progress=False)
    positions, rest = divmod(report["logits"], 1 + 16)  # target positions of the one step's 32 windows
    assert report["steps"] == 1 and report["out_of_budget"] and rest == 0 and 32 <= positions <= 32 * cfg.max_len


def test_the_time_cap_cuts_an_epoch_short_and_keeps_an_evaluated_model(split, tmp_path: Path):
    # at millions of windows one epoch outlasts the cap many times: it is checked after every step
    report = train_two_tower(split, tmp_path, tiny_config(max_train_s=1e-9, max_epochs=50, batch_size=1),
                             progress=False)
    assert report["out_of_time"] and report["epochs"] == report["best_epoch"] == 1
    assert report["steps"] == 1 < report["n_windows"]  # the first epoch stopped after one step
    assert len(report["history"]) == 1 and (tmp_path / MODEL_FILE).is_file()


def test_the_default_patience_rides_out_a_plateau_and_keeps_the_later_best(split, tmp_path: Path, monkeypatch):
    # ML-100K's valid NDCG@10 sits below an early peak for 4-5 evaluations (epochs 22-30), then climbs to
    # epoch ~60; a patience of 3 stopped the seed-42 fit on that plateau. A scripted valid curve of that shape
    # (peak at epoch 2, five evaluations below it, the real best at epoch 8, flat after):
    curve = [0.05, 0.10, 0.09, 0.095, 0.098, 0.097, 0.099, 0.12] + [0.11] * 30
    real = Run.evaluate

    def fit(patience: int, where: str) -> dict:
        values = iter(curve)

        def scripted(self, histories, targets):
            out = real(self, histories, targets)
            return {**out, "ndcg@10": next(values)} if targets is self.targets else out

        monkeypatch.setattr(Run, "evaluate", scripted)
        return train_two_tower(split, tmp_path / where, tiny_config(eval_every=1, max_epochs=30, patience=patience),
                               progress=False)

    default = RecallConfig.model_fields["patience"].default
    served = fit(default, "default")
    assert served["best_epoch"] == 8 and served["valid"]["ndcg@10"] == 0.12
    assert served["epochs"] == 8 + default  # stopped `patience` evaluations after its best
    short = fit(3, "short")
    assert short["best_epoch"] == 2 and short["epochs"] == 5  # the old default: stopped on the plateau


NO_CHANNELS = {"covisit_channel": False, "item_model": "off"}
REFIT = {"refit": True, **NO_CHANNELS}  # recall.refit is off by default


def _top(stage: RecallStage, split, users: np.ndarray) -> float:
    """Share of ``users`` whose test item ``stage`` ranks among its candidates (test-time history)."""
    return float(np.mean([split.test[u] in stage.run(Request(user_id="u", history=split.history(int(u), "test")),
                                                     Candidates.empty()).items for u in users]))


def test_the_refit_learns_from_the_valid_items_and_the_valid_phase_keeps_the_early_stopped_model(tmp_path: Path):
    split = valid_only_split()
    split.save(tmp_path / "split")
    report = train_two_tower(split, tmp_path / "recall", tiny_config(**REFIT), progress=False)
    assert report["refit"]["epochs"] == report["best_epoch"] and "test_early_stopped" in report
    assert (tmp_path / "recall" / EARLY_STOPPED_DIR / SPEC_FILE).is_file()
    spec = StageSpec(name="recall", kind="recall", depth=5)  # the ring successor r+1 stays first
    config = RecallConfig(popularity_share=0.0, **NO_CHANNELS)
    served, early = RecallStage(spec, config), RecallStage(spec, config)
    served.load(tmp_path)
    early.load(tmp_path, phase="valid")
    assert served.version() != early.version()
    # "after r comes N_r" is only in other users' valid items: the served (refit) model learnt it
    new_item_users = np.flatnonzero(split.test >= 30)
    assert len(new_item_users) == 24
    assert _top(served, split, new_item_users) >= 0.75
    assert _top(early, split, new_item_users) <= 0.25
    # the early-stopped model is what a valid-phase load serves, with the valid-time popularity
    np.testing.assert_array_equal(early.model.vectors, np.load(tmp_path / "recall" / EARLY_STOPPED_DIR / VECTORS_FILE))
    np.testing.assert_array_equal(early._popularity.popularity, split.item_popularity("valid"))
    np.testing.assert_array_equal(served._popularity.popularity, split.item_popularity("test"))


def test_without_the_refit_one_model_serves_both_phases_and_an_old_early_stopped_copy_goes(split, tmp_path: Path):
    split.save(tmp_path / "split")
    train_two_tower(split, tmp_path / "recall", tiny_config(max_epochs=5, **REFIT), progress=False)
    assert (tmp_path / "recall" / EARLY_STOPPED_DIR).is_dir()
    report = train_two_tower(split, tmp_path / "recall", tiny_config(max_epochs=5, **NO_CHANNELS),
                             progress=False)
    assert "refit" not in report and "test" in report
    assert not (tmp_path / "recall" / EARLY_STOPPED_DIR).exists()
    spec, config = StageSpec(name="recall", kind="recall", depth=5), RecallConfig(**NO_CHANNELS)
    test, valid = RecallStage(spec, config), RecallStage(spec, config)
    test.load(tmp_path)
    valid.load(tmp_path, phase="valid")
    assert test.version() == valid.version()


def test_the_held_out_copy_is_never_refit(split, tmp_path: Path):
    seqs = [s[:-1] for s in split.train_sequences]
    targets = np.array([s[-1] for s in split.train_sequences])
    report = train_two_tower(split, tmp_path, tiny_config(max_epochs=5, **REFIT), sequences=seqs,
                             early_stop_targets=targets, progress=False)
    assert "refit" not in report and not (tmp_path / EARLY_STOPPED_DIR).exists()


def test_the_refit_never_learns_a_new_item_of_the_cold_item_protocol(tmp_path: Path):
    split = valid_only_split()
    new = np.arange(30, split.n_items)
    split.protocol = {**split.protocol, "cold_items": {"items": new.tolist()}}  # as jobs.evaluation.cold_items marks them
    split.save(tmp_path / "split")
    train_two_tower(split, tmp_path / "recall", tiny_config(**REFIT), progress=False)
    served = RecallStage(StageSpec(name="recall", kind="recall", depth=5), RecallConfig(popularity_share=0.0,
                                                                                        **NO_CHANNELS))
    served.load(tmp_path)
    assert _top(served, split, np.flatnonzero(np.isin(split.test, new))) <= 0.25  # N_r is content alone


def test_a_fit_the_budget_cut_inside_an_epoch_is_refit_for_the_same_logits_per_target(split, tmp_path: Path):
    # at scale the budget stops a fit part-way through its first epoch: the refit must not run whole epochs
    n_items = split.n_items
    cfg = tiny_config(max_train_logits=3 * 32 * 8 * n_items, max_epochs=50, eval_every=1, batch_size=32, **REFIT)
    report = train_two_tower(split, tmp_path, cfg, progress=False)
    assert report["out_of_budget"] and report["best_epoch"] == report["epochs"] == 1 and report["steps"] < 32
    refit = report["refit"]
    assert refit["out_of_budget"] and refit["epochs"] == 1 and refit["steps"] < refit["n_windows"] / 32
    budget = report["best_logits"] * (report["positions"] + split.n_users) / report["positions"]
    assert budget <= refit["logits"] < budget + 32 * 8 * n_items  # one step past, as the fit's own budget
    # one that early stopping ended: the refit runs the best epoch count whole, never "cut" by the budget
    whole = train_two_tower(split, tmp_path / "whole", tiny_config(max_epochs=4, eval_every=2, **REFIT),
                            progress=False)
    assert whole["refit"]["epochs"] == whole["best_epoch"] and not whole["refit"]["out_of_budget"]


def test_a_valid_phase_load_refuses_a_refit_whose_early_stopped_copy_is_missing_or_another_runs(
        split, tmp_path: Path):
    split.save(tmp_path / "split")
    config = tiny_config(max_epochs=4, eval_every=2, **REFIT)
    train_two_tower(split, tmp_path / "recall", config, progress=False, seed=1)
    spec, serve = StageSpec(name="recall", kind="recall", depth=5), RecallConfig(**NO_CHANNELS)
    early = tmp_path / "recall" / EARLY_STOPPED_DIR
    # a retrain interrupted after its early-stopped fit: a new copy beside the old served model
    train_two_tower(split, tmp_path / "other", config, progress=False, seed=2)
    (early / MODEL_FILE).write_bytes((tmp_path / "other" / EARLY_STOPPED_DIR / MODEL_FILE).read_bytes())
    with pytest.raises(ValueError, match="not the one the served refit model was trained after"):
        RecallStage(spec, serve).load(tmp_path, phase="valid")
    shutil.rmtree(early)  # copied without its subdirectories, or deleted by hand
    with pytest.raises(FileNotFoundError, match="is a refit .* early-stopped copy here, which is missing"):
        RecallStage(spec, serve).load(tmp_path, phase="valid")
    RecallStage(spec, serve).load(tmp_path)  # serving needs only the refit model
