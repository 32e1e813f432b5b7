"""The convergence benchmark fits one two-tower per training loss on the same split and reports each."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.two_tower_fit import main


def _dataset(root: Path) -> Path:
    rng = np.random.default_rng(0)
    rows = ["user_id,item_id,timestamp"]
    for user in range(60):
        for step, item in enumerate(rng.choice(40, size=8, replace=False)):
            rows.append(f"u{user},i{item},{1_000_000 + 100 * user + step}")
    root.mkdir()
    (root / "interactions.csv").write_text("\n".join(rows) + "\n")
    return root


@pytest.mark.slow
def test_one_fit_per_loss_on_the_same_split(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text("recall: {dim: 16, max_len: 10, n_blocks: 1, n_heads: 1, max_epochs: 2, eval_every: 1,"
                      " use_text: false, n_negatives: 8, train_threads: 1}\n")
    out = tmp_path / "fit.json"
    main(["--data", str(_dataset(tmp_path / "data")), "--loss", "full", "sampled", "--config", str(config),
          "--artifacts", str(tmp_path / "art"), "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["provenance"]["seeds"] == [42] and report["users"] == 60
    for loss in ("full", "sampled"):
        row = report[loss]
        assert row["epochs"] == 2 and row["stopped_by"] == "max_epochs" and row["converged"] is False
        assert set(row["test"]) >= {"ndcg@10", "recall@200"} and row["cpu_s"] > 0
        assert [epoch for epoch, _ in row["evaluations_s"]] == [1, 2]
    assert (tmp_path / "art" / "full" / "model.pt").is_file() and (tmp_path / "art" / "sampled" / "model.pt").is_file()


def test_a_missing_data_directory_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x.json")])
    assert exit_info.value.code == 2
    assert "--data" in capsys.readouterr().err and not (tmp_path / "x.json").exists()
