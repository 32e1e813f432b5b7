"""``jobs.evaluation.llm_cases``: the LLM stage's candidates come from current stages."""

from __future__ import annotations

from pathlib import Path

import pytest

from cascade.settings import Settings
from jobs.evaluation.llm_cases import candidate_source
from jobs.prepare import prepare
from jobs.train import train_stages
from tests.jobs.test_train import TINY


@pytest.mark.slow
def test_candidates_come_from_current_stages_and_stale_ones_are_retrained(tmp_path: Path) -> None:
    art = tmp_path / "synthetic"
    split = prepare(None, art, n_users=60, n_items=120, seed=3)
    settings = Settings.build(TINY)
    train_stages(settings, art, split, stages=("recall", "recall_holdout", "coarse"), progress=False)
    _, source = candidate_source(split, art, settings)
    assert source == "coarse"  # current: reused as trained
    changed = Settings.build({**TINY, "coarse": {**TINY["coarse"], "n_estimators": 15}})
    candidates_for, source = candidate_source(split, art, changed)
    assert source == "coarse (retrained stale coarse)"
    _, items = candidates_for(0, split.history(0, "valid"))
    assert len(items) > 0 and not set(items.tolist()) & set(split.history(0, "valid").tolist())
