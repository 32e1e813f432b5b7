"""bench.ease_l2: each penalty's figures are the eval's EASE baseline at that penalty; valid picks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.ease_l2 import main, sweep
from jobs.evaluation.baselines import baseline_metrics
from jobs.prepare import prepare
from recall.config import RecallConfig


def test_each_penalty_is_the_ease_baseline_and_valid_picks_its_best(tmp_path: Path) -> None:
    split = prepare(None, tmp_path / "synthetic", n_users=80, n_items=60, seed=1)
    report = sweep(split, grid=(10.0, 5000.0), default=200.0)
    assert list(report["grid"]) == ["10.0", "200.0", "5000.0"]  # the default always among them
    for l2, row in report["grid"].items():
        for phase in ("valid", "test"):
            want = baseline_metrics(split, phase, 10, RecallConfig(ease_l2=float(l2)))["ease"]["ndcg@10"].mean()
            assert row[phase] == round(float(want), 5)
    assert report["grid"][str(report["valid_pick"])]["valid"] == max(r["valid"] for r in report["grid"].values())
    lo, hi = report["pick_vs_default_test"]["ci95"]
    assert lo <= report["pick_vs_default_test"]["delta"] <= hi
    assert report["users_per_item"] == round(len(split.train) / split.n_items, 2)


def test_writes_one_row_per_dataset_and_refuses_a_missing_folder(tmp_path: Path, capsys) -> None:
    shop = tmp_path / "shop"
    shop.mkdir()
    rows = [f"u{u},i{(u * 3 + j) % 9},{100 * u + j}" for u in range(14) for j in range(7)]
    (shop / "interactions.csv").write_text("user_id,item_id,timestamp\n" + "\n".join(rows) + "\n")
    main(["--data", str(shop), "--artifacts", str(tmp_path / "art"), "--out", str(tmp_path / "out.json")])
    out = json.loads((tmp_path / "out.json").read_text())
    assert list(out) == ["provenance", "datasets"] and list(out["datasets"]) == ["shop"]
    assert np.isfinite(out["datasets"]["shop"]["grid"]["500.0"]["test"])
    with pytest.raises(SystemExit) as exc:
        main(["--data", str(tmp_path / "absent"), "--artifacts", str(tmp_path / "art"), "--out", str(tmp_path / "x")])
    assert exc.value.code == 2 and "absent: no such directory" in capsys.readouterr().err
