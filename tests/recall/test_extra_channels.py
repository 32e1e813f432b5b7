"""The recall stage's extra channels: trained with the two-tower, shares tuned on valid, served."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from offline.protocol import GATE_FOLDS, SALT_CHANNEL_GATE, gate_verdict
from recall.artifacts import CHANNELS_FILE
from recall.channels import ChannelQuotas, clean_channel, merge_channels, priority_items
from recall.config import EARLY_STOPPED_DIR, RecallConfig
from recall.extra_channels import (
    MIN_TWO_TOWER_SHARE,
    SHARE_GRID,
    channel_candidate_recall,
    tune_shares,
)
from recall.stage import RecallStage
from recall.train import train_two_tower
from recsys.config import StageSpec
from recsys.contract import Candidates, Request
from tests.recall.two_tower_factories import successor_split, tiny_config

DEPTH = 12
ON = {"covisit_channel": True, "item_model": "ease", "ease_l2": 10.0, "covisit_window": 2}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, object, dict]:
    split = successor_split()
    root = tmp_path_factory.mktemp("art")
    split.save(root / "split")
    report = train_two_tower(split, root / "recall", tiny_config(max_epochs=5, refit=True, **ON), progress=False,
                             depth=DEPTH)
    return root, split, report


def _stage(root: Path, **params) -> RecallStage:
    stage = RecallStage(StageSpec(name="recall", kind="recall", depth=DEPTH, params={**ON, **params}),
                        RecallConfig())
    stage.load(root)
    return stage


def _priority_by_slot(cleaned: list[np.ndarray], caps: list[int], depth: int) -> list[int]:
    """The priority merge one slot at a time, as its definition reads: the lowest-numbered channel that
    is under its cap and has an item not yet taken gives the next slot; then the first channel fills."""
    taken: list[int] = []
    pos, filled = [0] * len(cleaned), [0] * len(cleaned)

    def next_free(c: int) -> int | None:
        while pos[c] < len(cleaned[c]) and int(cleaned[c][pos[c]]) in taken:
            pos[c] += 1
        return int(cleaned[c][pos[c]]) if pos[c] < len(cleaned[c]) else None

    while len(taken) < depth:
        open_ = [c for c in range(len(cleaned)) if filled[c] < caps[c] and next_free(c) is not None]
        if not open_:
            break
        taken.append(next_free(open_[0]))  # type: ignore[arg-type]
        filled[open_[0]] += 1
    while cleaned and len(taken) < depth and (extra := next_free(0)) is not None:
        taken.append(extra)
    return taken


@pytest.mark.parametrize("seed", range(5))
def test_priority_items_is_the_priority_merge(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lists = [(f"c{c}", rng.integers(-1, 30, size=rng.integers(0, 25)), rng.random(25)) for c in range(3)]
    lists = [(n, ids, s[: len(ids)]) for n, ids, s in lists]
    exclude = rng.integers(0, 30, size=4)
    caps = [int(x) for x in rng.integers(0, 10, size=3)]
    merged = merge_channels(lists, 15, exclude, quotas={n: c for (n, _, _), c in zip(lists, caps, strict=True)},
                            order="priority")
    cleaned = [clean_channel(ids, s, np.asarray(exclude), n)[0] for n, ids, s in lists]
    assert priority_items(cleaned, caps, 15).tolist() == merged.items.tolist() == _priority_by_slot(cleaned, caps, 15)


def test_channels_are_on_by_default_and_shares_validated() -> None:
    assert RecallConfig().extra_channels == ("covisit", "item_model") and RecallConfig().item_model == "ease"
    assert RecallConfig(covisit_channel=False, item_model="off").extra_channels == ()
    assert RecallConfig(covisit_channel=False, item_model="knn").extra_channels == ("item_model",)
    with pytest.raises(ValueError, match="unknown channel or share"):
        RecallConfig(channel_shares={"ann": 0.1})
    with pytest.raises(ValueError, match="exceed 1"):
        RecallConfig(channel_shares={"covisit": 0.5, "item_model": 0.5})


def test_training_saves_channels_and_tunes_shares_on_valid(trained) -> None:
    root, _, report = trained
    # the shares are gated with the early-stopped model (the refit one has learnt the valid items)
    meta = json.loads((root / "recall" / EARLY_STOPPED_DIR / CHANNELS_FILE).read_text())
    assert set(meta["channels"]) == {"covisit", "item_model"} and meta["channels"]["item_model"]["kind"] == "ease"
    assert (root / "recall" / "channels" / "covisit.npz").is_file()
    room = 1.0 - RecallConfig().popularity_share - MIN_TWO_TOWER_SHARE
    assert all(sum(g["shares"].values()) <= room + 1e-9 for g in meta["grid"])
    assert len(meta["grid"]) == sum(a + b <= room + 1e-9 for a in SHARE_GRID for b in SHARE_GRID)
    best = max(g["recall"] for g in meta["grid"])  # on every user
    challenger = next(g for g in meta["grid"] if g["shares"] == meta["gate"]["challenger"])
    assert challenger["recall"] == best  # and no grid point with the same recall has a smaller total share
    assert min(sum(g["shares"].values()) for g in meta["grid"] if g["recall"] == best) == sum(
        challenger["shares"].values())
    served = meta["gate"]["challenger"] if meta["gate"]["served"] == "challenger" else {"covisit": 0.0, "item_model": 0.0}
    assert meta["shares"] == served
    assert set(meta["own_recall"]) == {f"{c}@{DEPTH}" for c in ("two_tower", "covisit", "item_model", "popularity")}
    assert report["channels"]["shares"] == meta["shares"]
    served = json.loads((root / "recall" / CHANNELS_FILE).read_text())
    assert served["shares"] == meta["shares"] and served["shares_from"] == EARLY_STOPPED_DIR
    assert served["gate"] == meta["gate"] and "grid" not in served
    assert report["refit"]["channels"]["shares"] == meta["shares"]


def test_shares_are_tuned_at_the_popularity_of_the_sequences_learnt_not_the_targets(
        trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from recall import extra_channels
    from recall.channels import PopularityChannel

    root, split, _ = trained
    shutil.copytree(root / "recall" / EARLY_STOPPED_DIR, tmp_path / "recall_holdout")
    seen: list[np.ndarray] = []
    monkeypatch.setattr(extra_channels, "PopularityChannel", lambda pop: (seen.append(pop), PopularityChannel(pop))[1])
    held_out = [s[:-1] for s in split.train_sequences]  # as recall_holdout: each user's last training item out
    targets = np.array([s[-1] for s in split.train_sequences])
    extra_channels.train_channels(split, tmp_path, "recall_holdout", held_out, targets, tiny_config(**ON), DEPTH)
    assert len(seen) == 1
    np.testing.assert_array_equal(seen[0], split.item_popularity("valid") - np.bincount(targets,
                                                                                         minlength=split.n_items))


def test_the_refit_channels_are_fitted_on_the_valid_items_too(trained) -> None:
    root, split, _ = trained
    early = RecallStage(StageSpec(name="recall", kind="recall", depth=DEPTH, params=ON), RecallConfig())
    early.load(root, phase="valid")
    served = _stage(root)
    for name in ("covisit", "item_model"):
        weights = [next(c for c in s.model.extra if c.name == name).weights for s in (early, served)]
        assert (weights[0] != weights[1]).nnz > 0, name  # each user's valid item added a pair or more


def test_stage_serves_the_channels_with_quotas(trained) -> None:
    root, split, _ = trained
    stage = _stage(root, channel_shares={"covisit": 0.25, "item_model": 0.25})
    assert stage.mix.quotas(["covisit", "item_model"], cold=False) == {
        "covisit": 3, "item_model": 3, "two_tower": 12 - 1 - 6, "popularity": 1}
    assert stage.mix.quotas(["covisit", "item_model"], cold=True) == {
        "covisit": 0, "item_model": 0, "two_tower": 12 - 10, "popularity": 10}
    out = stage.run(Request(user_id="u", history=np.array([3, 4, 5])), Candidates.empty())
    assert {"src_two_tower", "src_covisit", "src_item_model", "src_popularity"} <= set(out.flags)
    covisit = [c for c in stage.model.extra if c.name == "covisit"][0]
    ids, _ = covisit.candidates(np.array([3, 4, 5]), np.array([3, 4, 5]), 3)
    assert ids[0] == 6  # every sequence goes 5 -> 6: the strongest forward pair
    assert not set(out.items) & {3, 4, 5} and len(out.items) == DEPTH


def test_tuned_shares_are_served_when_none_given(trained) -> None:
    root, _, _ = trained
    tuned = json.loads((root / "recall" / CHANNELS_FILE).read_text())["shares"]
    assert _stage(root).mix.shares == tuned
    plain = RecallStage(StageSpec(name="recall", kind="recall", depth=DEPTH), RecallConfig())
    assert plain.config.channel_shares is None
    off = RecallStage(StageSpec(name="recall", kind="recall", depth=DEPTH,
                                params={"covisit_channel": False, "item_model": "off"}), RecallConfig())
    off.load(root)  # channels switched off: trained artifacts ignored, two columns only
    out = off.run(Request(user_id="u", history=np.array([3, 4, 5])), Candidates.empty())
    assert set(out.flags) == {"src_two_tower", "src_popularity"}


def test_channel_candidate_recall_matches_the_served_lists(trained) -> None:
    root, split, _ = trained
    stage = _stage(root, channel_shares={"covisit": 0.2, "item_model": 0.2})
    got = channel_candidate_recall(stage, split, "test")
    assert set(got) == {f"{c}@{DEPTH}" for c in ("two_tower", "covisit", "item_model", "popularity", "merged")}
    served = [split.test[u] in stage.run(Request(user_id="u", history=split.history(u, "test"),
                                                 user_attrs=split.user_attrs(u)), Candidates.empty()).items
              for u in range(split.n_users)]
    assert got[f"merged@{DEPTH}"] == round(float(np.mean(served)), 5)


def test_missing_channel_artifacts_are_named(tmp_path: Path, trained) -> None:
    root, _, _ = trained
    bare = tmp_path / "bare"
    (bare / "recall").mkdir(parents=True)
    for f in (root / "recall").iterdir():
        if f.name not in (CHANNELS_FILE, "channels"):
            (bare / "recall" / f.name).symlink_to(f)
    (bare / "split").symlink_to(root / "split")
    with pytest.raises(FileNotFoundError, match=CHANNELS_FILE):
        _stage(bare)


def test_own_recall_counts_a_channel_after_its_excluded_items() -> None:
    from recall.extra_channels import own_recall

    f = np.ones(3, np.float32)
    lists = [[("a", np.array([5, 1, 2]), f), ("b", np.array([2, 7, 1]), f)],
             [("a", np.array([3, 4, 6]), f), ("b", np.array([6, 3, 4]), f)]]
    # user 0: excluded 5, target 2 -> a's top 2 is [1, 2] (hit), b's [2, 7] (hit); user 1: target 6
    got = own_recall(lists, [np.array([5]), np.array([9])], np.array([2, 6]), 2)
    assert got == {"a@2": 0.5, "b@2": 1.0}


def _gate_case(n_users: int, channel_wins: np.ndarray, tower_only: np.ndarray | None = None) -> dict:
    """``tune_shares`` on made-up lists at depth 10 (one popularity slot): the target is the
    co-visitation channel's first item where ``channel_wins``, else the two-tower's 9th item,
    which any co-visitation quota pushes out of the priority merge; where ``tower_only`` is false
    (default: true everywhere) it is the two-tower's first item instead, which every merge keeps."""
    mix = ChannelQuotas(RecallConfig(item_model="off"), depth=10)
    tower_only = np.ones(n_users, bool) if tower_only is None else tower_only
    lists, targets = [], []
    for u in range(n_users):
        tower = np.arange(100, 150)
        covisit = np.arange(1000 + 10 * u, 1010 + 10 * u)
        lists.append([("two_tower", tower, -np.arange(50.0)), ("covisit", covisit, -np.arange(10.0)),
                      ("popularity", np.arange(900, 960), -np.arange(60.0))])
        targets.append(covisit[0] if channel_wins[u] else tower[8] if tower_only[u] else tower[0])
    return tune_shares(mix, lists, [np.zeros(0, np.int64)] * n_users, np.asarray(targets), seed=0)


def test_shares_better_on_every_user_are_served() -> None:
    meta = _gate_case(200, np.ones(200, bool))
    assert meta["gate"]["served"] == "challenger" and meta["shares"]["covisit"] > 0 and meta["gate"]["ci95"][0] > 0
    assert meta["valid_recall"] == 1.0 and len(meta["gate"]["fold_choices"]) == GATE_FOLDS


def test_shares_whose_gain_is_inside_the_noise_are_not_served() -> None:
    # covisit wins on 105 users and costs 95 others their target: the best on every user, not beyond the CI
    wins = np.zeros(200, bool)
    wins[np.random.default_rng(0).permutation(200)[:105]] = True
    meta = _gate_case(200, wins)
    assert meta["gate"]["challenger"]["covisit"] > 0 and meta["gate"]["ci95"][0] < 0 < meta["gate"]["ci95"][1]
    assert meta["gate"]["served"] == "incumbent" and meta["shares"] == {"covisit": 0.0}
    assert meta["valid_recall"] == 0.475


def test_the_gate_pools_every_user_so_a_few_hundred_serve_a_clear_gain() -> None:
    # 30 users gain their target, 12 lose it, the rest keep it either way: +0.09 candidate recall
    kind = np.array([1] * 30 + [-1] * 12 + [0] * 158)
    np.random.default_rng(2).shuffle(kind)
    meta = _gate_case(200, kind == 1, tower_only=kind == -1)
    assert meta["gate"]["served"] == "challenger" and meta["gate"]["n_users"] == 200 and meta["gate"]["ci95"][0] > 0
    # judged on one held-out half of these users alone, the same gain has a CI across zero
    half = np.random.default_rng([0, SALT_CHANNEL_GATE]).permutation(200)[100:]
    assert gate_verdict(np.zeros(len(half)), kind[half].astype(float), 0)["ci95"][0] <= 0


def test_too_few_users_keep_the_incumbent() -> None:
    meta = _gate_case(30, np.ones(30, bool))
    assert meta["shares"] == {"covisit": 0.0} and "the gate needs 40" in meta["gate"]["why"]
