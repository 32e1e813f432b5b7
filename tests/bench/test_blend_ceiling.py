"""bench.blend_ceiling: the blend's ends are the cascade's coarse order and the EASE baseline, exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.blend_ceiling import WEIGHTS, ceiling, main
from cascade.registry import build_pipeline
from jobs.evaluation.baselines import baseline_metrics
from jobs.evaluation.cascade_run import run_cascade
from offline.metrics import per_user_metrics
from offline.split import Split


def test_weight_zero_is_coarse_and_weight_one_the_ease_baseline(tiny_cascade) -> None:
    art, settings = tiny_cascade
    report = ceiling(art, settings)
    split = Split.load(art / "split")
    targets = split.targets("test")
    users = targets >= 0
    run = run_cascade(build_pipeline(settings, art, only=("recall", "coarse"), phase="test"), split, "test",
                      progress=False)
    coarse = per_user_metrics(run["tops"]["coarse"], targets, 10)["ndcg@10"][users].mean()
    ease = baseline_metrics(split, "test", 10)["ease"]["ndcg@10"][users].mean()
    assert report["coarse"] == report["within_list"]["ndcg@10"]["0.0"] == round(float(coarse), 5)
    assert report["ease"] == round(float(ease), 5)
    assert report["best"] == max(report["ndcg@10"].values()) and report["best_weight"] in WEIGHTS
    lo, hi = report["best_vs_coarse"]["ci95"]
    assert lo <= report["best_vs_coarse"]["mean"] <= hi
    assert 0 <= report["ease_top10_hits_missing_from_coarse_list"] <= report["ease_top10_hits"]
    assert report["users"] == int(np.sum(users))


def test_a_directory_that_is_no_trained_cascade_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--artifacts", str(tmp_path), "--out", str(tmp_path / "out.json")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: not a trained cascade") and err.count("\n") == 1
    assert not (tmp_path / "out.json").exists()
