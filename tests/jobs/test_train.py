"""The whole cascade at toy size: prepare -> train every stage -> evaluate, and reuse on rerun.

Preparing the split on its own: ``tests/jobs/test_prepare.py``."""

import hashlib
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cascade.registry import build_pipeline
from cascade.settings import Settings
from coarse_rank.dataset import prefix_popularity
from jobs.evaluation.evaluate import evaluate_pipeline
from jobs.fusion_gate import gate_pipeline
from jobs.prepare import prepare
from jobs.train import (
    DEFAULT_STAGES,
    fit_threads,
    fit_two_towers,
    holdout_recall,
    holdout_sequences,
    train_stages,
)
from recall.config import EARLY_STOPPED_DIR
from recsys.pipeline import SHORT_EXHAUSTED, SHORT_RULES, Pipeline

TINY = {
    "recall": {"dim": 16, "max_len": 10, "n_blocks": 1, "n_heads": 1, "max_epochs": 4, "eval_every": 2,
               "use_text": False},
    "coarse": {"n_estimators": 20, "min_child_samples": 5, "early_stopping_rounds": 5, "train_positions": 2},
}


@pytest.mark.slow
def test_tiny_cascade_trains_evaluates_and_is_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    settings = Settings.build({**TINY, "recall": {**TINY["recall"], "refit": True}})
    art = tmp_path / "synthetic"
    split = prepare(None, art, n_users=60, n_items=120, seed=3)
    report = train_stages(settings, art, split)
    assert list(report) == list(DEFAULT_STAGES)
    assert all(not r.get("reused") for r in report.values())
    again = train_stages(settings, art, split)
    assert all(r.get("reused") for r in again.values())
    # retraining an upstream stage retrains everything downstream of it
    import coarse_rank.train

    seen = {}
    real = coarse_rank.train.train_coarse
    monkeypatch.setattr(coarse_rank.train, "train_coarse", lambda sp, stage, *a, **kw: (
        seen.update(valid=stage, train=kw["train_stage"]), real(sp, stage, *a, **kw))[1])
    forced = train_stages(settings, art, split, stages=("recall_holdout", "coarse"), force=True)
    # coarse recalled its train groups without their labels in the popularity, its valid groups at valid time
    np.testing.assert_array_equal(seen["train"]._popularity.popularity, prefix_popularity(split, 2))
    np.testing.assert_array_equal(seen["valid"]._popularity.popularity, split.item_popularity("valid"))
    assert not forced["coarse"].get("reused")
    # ... also when that happened in another command: fusion learnt from the coarse model just replaced
    later = train_stages(settings, art, split)
    assert [k for k, r in later.items() if not r.get("reused")] == ["fusion"]
    assert all(r.get("reused") for r in train_stages(settings, art, split).values())
    # the served recall model is the refit; the jobs that tune on valid items read the early-stopped one
    def recall_version(pipeline: Pipeline) -> str:
        return next(stage for spec, stage in pipeline.stages if spec.kind == "recall").version()

    early = hashlib.sha256((art / "recall" / EARLY_STOPPED_DIR / "model.pt").read_bytes()).hexdigest()[:12]
    assert recall_version(gate_pipeline(settings, art)) == early
    assert recall_version(build_pipeline(settings, art, phase="valid")) == early
    assert recall_version(build_pipeline(settings, art)) != early
    assert report["recall"]["refit"]["epochs"] == report["recall"]["best_epoch"]
    assert "refit" not in report["recall_holdout"]
    holdout = hashlib.sha256((art / "recall_holdout" / "model.pt").read_bytes()).hexdigest()[:12]
    assert seen["valid"].version() == seen["train"].version() == holdout  # the held-out model, both times
    # a recall_llm stage's own params are the LLM channel's: the held-out two-tower serves without them
    llm = settings.model_copy(update={"pipeline": settings.pipeline.model_copy(update={"stages": [
        s.model_copy(update={"kind": "recall_llm", "params": {"llm_share": 0.1}}) if s.name == "recall" else s
        for s in settings.pipeline.stages]})})
    assert holdout_recall(llm, art, split, 2)[0].version() == holdout

    ev = evaluate_pipeline(settings, art, split, phase="test", progress=False, n_boot=200)
    assert ev["n_users"] == split.n_users and ev["dataset"] == "synthetic"
    assert set(ev["stages"]) == {"popularity", "covisit_last", "ease", "popularity_recent", "recall", "coarse", "final"}
    assert ev["baselines"]["best"] in {"popularity", "covisit_last", "ease", "popularity_recent"}
    assert ev["baselines"]["verdict"] in {"beats", "ties", "loses"} and ev["baselines"]["served"] == "final"
    free = ev["baselines"]["without_rules"]  # the same best baseline against the list no rule constrains
    assert free["best"] == ev["baselines"]["best"] and free["served"] == "final_without_rules"
    assert free["ndcg@10"]["mean"] - ev["baselines"]["ndcg@10"]["mean"] == pytest.approx(
        ev["policy_costs"]["all_rules"]["mean"], abs=2e-5)
    assert set(ev["candidate_recall"]) == {"recall@200", "coarse@50"}
    assert set(ev["deltas"]) == {"coarse_vs_recall", "final_vs_coarse"}
    lo, hi = ev["deltas"]["coarse_vs_recall"]["ndcg@10"]["ci95"]
    assert lo <= ev["deltas"]["coarse_vs_recall"]["ndcg@10"]["mean"] <= hi
    assert ev["stage_status"]["llm"] == {"skipped": split.n_users}
    # what was on among the LLM sources, and why: here none (no tags/, the llm stage disabled)
    assert ev["llm_sources"]["coarse_llm_embedding_features"]["coarse"] == forced["coarse"]["llm_embedding_features"]
    assert forced["coarse"]["llm_embedding_features"]["chosen"] is False
    assert not any(ev["llm_sources"][k]["on"] for k in ("llm_rerank", "llm_recall_channel", "llm_tag_rules"))
    assert 0 <= ev["stages"]["final"]["ndcg@10"] <= 1
    # right by default: every user gets a full list, and the price of each rule is reported
    lists = ev["lists"]
    assert lists["empty"] == 0 and lists["complete"] + lists["short"] == split.n_users
    # a user is short only where the whole catalog holds fewer than 10 unseen items they may see
    assert sum(lists["short_reasons"].values()) == lists["short"]
    assert set(lists["short_reasons"]) <= {SHORT_RULES, SHORT_EXHAUSTED}
    costs = ev["policy_costs"]
    assert "adult_gate" in costs["rules_in_force"] and set(costs["per_rule"]) == set(costs["rules_in_force"])
    dec = costs["decomposition"]
    assert dec["rules"] + dec["fusion"] + dec["stage_order"] == pytest.approx(dec["final_minus_coarse"], abs=3e-5)
    assert dec["stage_order"] == 0.0  # no rules and no fusion: exactly coarse's own top 10
    # short histories: a 5-core toy log has no user with 1-5 items, so that slice is built by truncation
    short = ev["short_history"]["slices"]
    assert set(short) == {"1-5", "6-20", ">20"}
    assert short["1-5"]["truncated"] and 0 < short["1-5"]["users"] <= 300
    for row in short.values():
        if "skipped" in row:
            continue
        assert {"recall", "coarse", "final"} <= set(row["stages"])
        assert all(0 <= m["ndcg@10"] <= m["recall@10"] <= 1 for m in row["stages"].values())
        assert set(row["deltas"]) == {"coarse_vs_recall", "final_vs_coarse"}
        for d in row["deltas"].values():
            assert d["ci95"][0] <= d["mean"] <= d["ci95"][1]

    # a changed setting (here the recall popularity share) retrains that stage and everything after it
    changed = train_stages(Settings.build({**TINY, "recall": {**TINY["recall"], "popularity_share": 0.2}}), art, split)
    assert not any(r.get("reused") for r in changed.values())

    # fusion weights belong to the rule set they were tuned under: a new rule set retunes them
    mine = tmp_path / "mine.yaml"
    mine.write_text("version: mine-1\nrules:\n  - {id: one, kind: blocklist, items: {item_ids: ['i001']}}\n")
    retuned = train_stages(Settings.build({**TINY, "recall": {**TINY["recall"], "popularity_share": 0.2},
                                           "rules": {"ruleset": str(mine)}}), art, split)
    assert retuned["recall"]["reused"] and retuned["coarse"]["reused"] and not retuned["fusion"].get("reused")

    # the channel shares are gated at the recall depth and coarse learns from candidates cut at it: a new
    # depth retrains the cascade (it used to retrain only fusion, and the shares stayed gated at 200)
    base = {**TINY, "recall": {**TINY["recall"], "popularity_share": 0.2}, "rules": {"ruleset": str(mine)}}
    stages = [sp.model_dump() for sp in Settings.build(base).pipeline.stages]
    stages[0]["depth"] = 100
    deeper = train_stages(Settings.build({**base, "pipeline": {"stages": stages}}), art, split)
    assert not any(r.get("reused") for r in deeper.values())
    assert set(deeper["recall"]["channels"]["own_recall"]) == {f"{c}@100" for c in ("two_tower", "covisit",
                                                                                   "item_model", "popularity")}
    # a recall stage's params are what it serves: switching a channel off there retrains the whole cascade
    stages[0]["params"] = {"covisit_channel": False}
    off = train_stages(Settings.build({**base, "pipeline": {"stages": stages}}), art, split)
    assert not any(r.get("reused") for r in off.values())
    assert set(off["recall"]["channels"]["shares"]) == {"item_model"}  # fitted with the channel off


@pytest.mark.slow
def test_user_caps_bound_every_training_time_measurement(tmp_path: Path):
    # past a cap, early stopping, share tuning, the coarse query groups and fusion tuning read a
    # seeded sample of that many users (so their cost stops growing with users), not all of them
    capped = {**TINY, "recall": {**TINY["recall"], "tune_users": 20},
              "coarse": {**TINY["coarse"], "max_train_users": 25, "max_valid_users": 15}, "fusion": {"tune_users": 12}}
    art = tmp_path / "synthetic"
    split = prepare(None, art, n_users=60, n_items=120, seed=3)
    report = train_stages(Settings.build(capped), art, split)
    assert report["recall"]["early_stop_users"] == report["recall_holdout"]["early_stop_users"] == 20
    assert report["coarse"]["n_train_groups"] <= 25 * 2 and report["coarse"]["n_valid_groups"] <= 15
    assert report["fusion"]["valid_users"] == 12
    uncapped = train_stages(Settings.build(TINY), tmp_path / "all", prepare(None, tmp_path / "all", n_users=60,
                                                                          n_items=120, seed=3))
    assert uncapped["recall"]["early_stop_users"] == 60 and uncapped["fusion"]["valid_users"] == 60


def test_two_towers_fitted_at_once_equal_those_fitted_one_after_the_other(tmp_path: Path):
    # each child fits on the thread count given, so the models are those of a sequential fit on it
    split = prepare(None, tmp_path / "at_once", n_users=60, n_items=120, seed=3)
    at_once = fit_two_towers(Settings.build(TINY), tmp_path / "at_once", split, progress=False, threads=1)
    one_thread = Settings.build({**TINY, "recall": {**TINY["recall"], "train_threads": 1}})
    assert fit_threads(one_thread) is None
    apart = train_stages(one_thread, tmp_path / "apart", prepare(None, tmp_path / "apart", n_users=60, n_items=120,
                                                                  seed=3), stages=("recall", "recall_holdout"))
    for stage, report in zip(("recall", "recall_holdout"), at_once, strict=True):
        assert report["valid"] == apart[stage]["valid"] and report["epochs"] == apart[stage]["epochs"]
        np.testing.assert_array_equal(np.load(tmp_path / "at_once" / stage / "item_vectors.npy"),
                                      np.load(tmp_path / "apart" / stage / "item_vectors.npy"))


def test_fits_run_at_once_on_half_the_cores_each_unless_threads_are_set(monkeypatch: pytest.MonkeyPatch):
    for cores, threads in ((1, None), (2, 1), (8, 4)):
        monkeypatch.setattr("os.sched_getaffinity", lambda _, n=cores: set(range(n)))
        assert fit_threads(Settings.build(TINY)) == threads
    assert fit_threads(Settings.build({**TINY, "recall": {**TINY["recall"], "train_threads": 2}})) is None
    assert fit_threads(Settings.build({**TINY, "ray": {"address": "local:2", "num_workers": 2}})) is None
    monkeypatch.setitem(multiprocessing.current_process()._config, "daemon", True)  # type: ignore[attr-defined]
    assert fit_threads(Settings.build(TINY)) is None  # a daemonic process may not start children


def test_holdout_sequences_hold_out_the_last_items(tmp_path: Path):
    split = prepare(None, tmp_path / "s", n_users=20, n_items=60, seed=1)
    seqs, targets = holdout_sequences(split, positions=2)
    for u, full in enumerate(split.train_sequences):
        if len(full) >= 3:
            assert seqs[u].tolist() == full[:-2].tolist() and targets[u] == full[-2]
        else:
            assert seqs[u].tolist() == full[: len(full) - min(2, len(full) - 1)].tolist()


def test_the_two_towers_fit_at_once_only_past_a_few_thousand_events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import jobs.train

    class AtOnce(Exception):
        pass

    def at_once(*args, **kwargs):
        raise AtOnce

    monkeypatch.setattr(jobs.train, "fit_threads", lambda settings: 1)  # as on 2 free cores
    monkeypatch.setattr(jobs.train, "fit_two_towers", at_once)
    split = prepare(None, tmp_path / "small", n_users=60, n_items=120, seed=3)
    assert len(split.train) < jobs.train.AT_ONCE_MIN_EVENTS  # starting two processes would cost more than it saves
    report = train_stages(Settings.build(TINY), tmp_path / "small", split, stages=("recall", "recall_holdout"))
    assert set(report) == {"recall", "recall_holdout"}
    monkeypatch.setattr(jobs.train, "AT_ONCE_MIN_EVENTS", 0)
    with pytest.raises(AtOnce):
        train_stages(Settings.build(TINY), tmp_path / "small", split, stages=("recall", "recall_holdout"), force=True)


@pytest.mark.slow
def test_coarse_reads_the_llm_item_embeddings_when_recsys_tag_embed_wrote_them(tmp_path: Path):
    # coarse.llm_embedding_features auto (the default): off without <artifact_dir>/tags, gated with them
    from jobs.evaluation.llm_sources import llm_sources
    from jobs.tagging.catalog import catalog_digest

    settings = Settings.build({**TINY, "recall": {**TINY["recall"], "train_threads": 1},
                               "coarse": {**TINY["coarse"], "num_threads": 1, "cold_item_dropout": 0.0,
                                         "young_item_copies": 0.0}})
    art = tmp_path / "synthetic"
    split = prepare(None, art, n_users=60, n_items=120, seed=3)
    off = train_stages(settings, art, split, stages=("recall_holdout", "coarse"))["coarse"]
    tags = art / "tags"
    assert off["llm_embedding_features"] == {
        "chosen": False, "why": f"no LLM item embeddings in {tags}; `recsys tag --method embed` writes them"}
    assert llm_sources(settings, art)["coarse_llm_embedding_features"] == {"coarse": off["llm_embedding_features"]}
    tags.mkdir()
    np.save(tags / "hidden.npy", np.random.default_rng(0).normal(size=(split.n_items, 12)).astype(np.float32))
    (tags / "version.json").write_text(f'{{"catalog": "{catalog_digest(split.items["item_id"].tolist())}"}}')
    # no --force: the embeddings written since are part of what the trained ranker was made from
    gated = train_stages(settings, art, split, stages=("coarse",))["coarse"]["llm_embedding_features"]
    assert set(gated) == {"chosen", "why", "valid_ndcg", "gate", "dropout", "fit_seeds"}
    assert (gated["gate"]["ci95"][0] > 0) is gated["chosen"]
    assert llm_sources(settings, art)["coarse_llm_embedding_features"]["coarse"] == {
        k: gated[k] for k in ("chosen", "why", "valid_ndcg", "gate")}
    assert train_stages(settings, art, split, stages=("coarse",))["coarse"]["reused"] is True
    (tags / "version.json").write_text('{"catalog": "another"}')  # made for another catalog: said, not ignored
    with pytest.raises(ValueError, match="another catalog"):
        train_stages(settings, art, split, stages=("coarse",))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_the_two_tower_pool_dies_with_its_parent(tmp_path):
    """A fit's child process must not outlive an eval stopped with SIGTERM (it would hold a core for its whole fit)."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import time\n"
        "from jobs.train import guarded_pool\n"
        "if __name__ == '__main__':\n"
        "    pool = guarded_pool(1)\n"
        "    pool.submit(time.sleep, 120)\n"
        "    print(next(iter(pool._processes)), flush=True)\n"
        "    time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[2],
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    child = int(parent.stdout.readline())
    parent.send_signal(signal.SIGTERM)
    parent.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    orphaned = _alive(child)
    if orphaned:
        os.kill(child, signal.SIGKILL)
    assert not orphaned


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return state != "Z"
