"""Offline A/B on the toy catalog with real (toy) stages: every key, exact LLM counts, the report."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from cascade.registry import STAGE_KINDS, StaleArtifacts, config_id
from cascade.settings import Settings
from jobs.ab.compare import PAIRED, compare_offline, paired_differences, per_user_beyond_accuracy
from jobs.ab.report import write_offline_report
from jobs.ab.split_check import check_same_split, split_differences
from jobs.prepare import prepare
from offline.split import Split, split_id
from recsys.config import StageSpec
from tests.serving.toy import TOY_KINDS, save_toy_split, toy_settings

RECALL = StageSpec(name="recall", kind="recall", on_error="fail")
LLM = StageSpec(name="llm", kind="llm")
RULES = StageSpec(name="rules", kind="rules", on_error="fail")


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Split]:
    for kind, path in TOY_KINDS.items():
        monkeypatch.setitem(STAGE_KINDS, kind, path)
    return tmp_path, save_toy_split(tmp_path)


def test_offline_ab_returns_every_key(toy: tuple[Path, Split], tmp_path: Path) -> None:
    art, split = toy
    report = compare_offline(toy_settings(RECALL, RULES), toy_settings(RECALL, LLM, RULES), art, split,
                             names=("light", "llm"), n_boot=200)
    assert set(report) == {"dataset", "protocol", "n_users", "n_items", "variants", "differences",
                           "difference_is", "warnings", "latencies_ms"}
    assert report["n_users"] == 3 and report["difference_is"] == "llm - light"
    for name in ("light", "llm"):
        v = report["variants"][name]
        assert set(v["metrics"]) == {"ndcg@10", "recall@10", "mrr@10", "intra_list_diversity", "novelty", "coverage"}
        assert set(v["latency_ms"]) == {"p50", "p90", "p95", "p99", "mean", "max"}
        assert v["lists"]["users"] == 3 and v["lists"]["empty"] == 0
        assert len(report["latencies_ms"][name]) == 3
    assert report["variants"]["light"]["llm"] == {"calls": 0, "prompt_tokens": 0, "tokens_per_call": 0.0}
    assert report["variants"]["llm"]["llm"]["calls"] == 3  # the toy re-ranker has no prompt: 0 tokens
    assert set(report["differences"]) == {*PAIRED, "coverage"}
    for name in PAIRED:
        d = report["differences"][name]
        assert d["diff"] == pytest.approx(d["b"] - d["a"], abs=1e-4) and len(d["ci95"]) == 2
    assert report["differences"]["coverage"]["ci95"] is None

    md = write_offline_report({k: v for k, v in report.items() if k != "latencies_ms"}, tmp_path / "rep",
                              report["latencies_ms"])
    assert "# Offline A/B: llm vs light" in md.read_text()
    for png in ("offline_differences.png", "offline_latency_cdf.png"):
        assert 0 < (tmp_path / "rep" / png).stat().st_size < 200_000


def test_beyond_accuracy_per_user_by_hand(toy: tuple[Path, Split]) -> None:
    _, split = toy
    split.items["categories"] = [["a"], ["a", "b"], ["b"], ["c"], ["a"], ["c"]]
    tops = np.array([[0, 1, -1], [0, 4, -1], [2, -1, -1]])
    out = per_user_beyond_accuracy(split, tops, "test")
    # {a} vs {a,b}: 1 - 1/2; {a} vs {a}: 0; a single item has no pair
    assert out["intra_list_diversity"][:2].tolist() == [0.5, 0.0]
    assert np.isnan(out["intra_list_diversity"][2])
    assert np.isfinite(out["novelty"]).all()


def record_training(art: Path, settings: Settings, on_split: str | None = None) -> None:
    """The ``recall/stage.json`` training writes: the split and the config the stage was trained on."""
    (art / "recall").mkdir(exist_ok=True)
    (art / "recall" / "stage.json").write_text(json.dumps(
        {"split_id": on_split or split_id(art), "config_id": config_id(settings, "recall")}))


def test_stages_trained_on_another_split_are_refused(toy: tuple[Path, Split]) -> None:
    # `prepare` again rebuilt the split: every index the recall stage holds points at another catalog
    art, split = toy
    settings = toy_settings(RECALL, RULES)
    record_training(art, settings, on_split="0123456789abcdef")
    with pytest.raises(StaleArtifacts, match=r"stage\(s\) \['recall'\] were trained on another split"):
        compare_offline(settings, settings, art, split, n_boot=200)


def test_b_measured_with_stages_trained_under_a_settings_is_warned(toy: tuple[Path, Split], tmp_path: Path) -> None:
    art, split = toy
    settings_a = toy_settings(RECALL, RULES)
    settings_b = toy_settings(RECALL.model_copy(update={"depth": 50}), RULES)  # changes what recall serves
    record_training(art, settings_a)
    report = compare_offline(settings_a, settings_b, art, split, n_boot=200)
    stale = [w for w in report["warnings"] if "trained under other settings" in w]
    assert len(stale) == 1 and stale[0].startswith(f"B: stage(s) ['recall'] in {art} were trained under other")
    assert "--artifacts-b" in stale[0]
    # B trained into its own directory on the same split: no warning
    art_b = tmp_path.parent / f"{tmp_path.name}-b"
    shutil.copytree(art / "split", art_b / "split")
    record_training(art_b, settings_b)
    own = compare_offline(settings_a, settings_b, art, split, n_boot=200, artifact_dir_b=art_b)
    assert not [w for w in own["warnings"] if "trained under other settings" in w]
    other = tmp_path.parent / f"{tmp_path.name}-other"
    other.mkdir()
    with pytest.raises(ValueError, match=r"holds no split \(.*split\.json is missing\)"):
        compare_offline(settings_a, settings_b, art, split, n_boot=200, artifact_dir_b=other)


def _shop(root: Path, extra_items: tuple[str, ...] = ()) -> Path:
    """A generic shop of 30 users x 12 items, 8 events each, listing one product nobody bought."""
    root.mkdir(parents=True, exist_ok=True)
    rows = [f"u{u},i{(u + j) % 12},{1000 + j}" for u in range(30) for j in range(8)]
    (root / "interactions.csv").write_text("user_id,item_id,timestamp\n" + "\n".join(rows) + "\n")
    items = ["item_id,title", *(f"i{i},Product {i}" for i in range(12)), "i90,Never bought", *extra_items]
    (root / "items.csv").write_text("\n".join(items) + "\n")
    return root


def test_b_on_another_split_is_refused_naming_what_differs(tmp_path: Path) -> None:
    """A prepared with --catalog listed, B trained with the defaults into a fresh directory (the interacted
    catalog): the refusal names the difference and a command that trains B on A's split, not the one just run."""
    shop = _shop(tmp_path / "shop")
    art_a, art_b = tmp_path / "a", tmp_path / "b"
    split = prepare(shop, art_a, catalog="listed", k_core=3)
    prepare(shop, art_b)
    settings = toy_settings(RECALL, RULES)
    with pytest.raises(ValueError) as refused:
        compare_offline(settings, settings, art_a, split, n_boot=200, artifact_dir_b=art_b)
    assert str(refused.value) == (
        f"{art_b}: B's artifact directory holds another split than {art_a} (k_core 3 vs 5; catalog listed vs "
        "interacted); both variants must be trained on the split they are measured on: `recsys train --data DIR "
        f"--config <B> --artifacts {art_b} --k-core 3 --catalog listed`, DIR being the data A's split was prepared "
        "from ('shop')")
    _shop(shop, ("i91,Listed today",))  # B prepared from the next export of the shop, with A's options
    prepare(shop, art_b, catalog="listed", k_core=3)
    assert split_differences(art_a, art_b) == ["the files of dataset 'shop' differ (items.csv 191 vs 208 bytes)"]
    shutil.rmtree(art_b / "split")
    shutil.copytree(art_a / "split", art_b / "split")  # the same split: no refusal
    check_same_split(art_a, art_b)


def test_empty_lists_are_counted_and_warned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # B's real rules stage blocks the whole catalog: every user gets an empty list
    monkeypatch.setitem(STAGE_KINDS, "recall", TOY_KINDS["recall"])
    split = save_toy_split(tmp_path)
    (tmp_path / "block.yaml").write_text("version: block-all\n"
                                         "rules: [{id: all, kind: blocklist, items: {item_ids: [m1, m2, m3, m4, m5, m6]}}]\n")
    settings_b = Settings.build({"pipeline": {"max_k": 5, "stages": [s.model_dump() for s in (RECALL, RULES)]},
                                 "rules": {"ruleset": str(tmp_path / "block.yaml")}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # was: RuntimeWarning "Mean of empty slice"
        report = compare_offline(toy_settings(RECALL, RULES), settings_b, tmp_path, split, n_boot=200)
    b = report["variants"]["B"]
    assert (b["lists"]["users"], b["lists"]["empty"], b["lists"]["empty_share"]) == (3, 3, 1.0)
    assert b["metrics"]["intra_list_diversity"] is None and b["metrics"]["novelty"] is None
    assert "B: 3 of 3 users got an empty list" in " ".join(report["warnings"])
    assert any("['intra_list_diversity', 'novelty']" in w and "left out of 'differences'" in w
               for w in report["warnings"])
    md = write_offline_report({k: v for k, v in report.items() if k != "latencies_ms"}, tmp_path / "rep")
    text = md.read_text()
    assert "| B | 3 | 3 | 0 | 0 |" in text and "> **Warning**: B: 3 of 3 users got an empty list" in text


def test_a_bootstrap_p_value_of_zero_is_reported_as_its_bound(toy: tuple[Path, Split], tmp_path: Path) -> None:
    # B beats A by 1 for every user: no resample reaches 0, and "p = 0.0" claimed more than 200 resamples resolve
    a = {name: np.zeros(5) for name in PAIRED}
    b = {name: np.arange(1.0, 6.0) for name in PAIRED}
    diffs = paired_differences(a, b, n_boot=200, seed=0)
    assert all(d["p_value"] == 2 / 200 and d["p_value_is_bound"] for d in diffs.values())
    same = paired_differences(a, a, n_boot=200, seed=0)
    assert all(d["p_value"] == 1.0 and not d["p_value_is_bound"] for d in same.values())
    art, split = toy
    report = compare_offline(toy_settings(RECALL, RULES), toy_settings(RECALL, LLM, RULES), art, split, n_boot=200)
    report["differences"].update(diffs)
    md = write_offline_report({k: v for k, v in report.items() if k != "latencies_ms"}, tmp_path / "rep")
    assert "| ndcg@10 | 0.0 | 3.0 | +3 | [+" in md.read_text() and "| < 0.01 | " in md.read_text()
