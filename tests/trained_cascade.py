"""A tiny cascade trained for real (recall, recall_holdout, coarse, fusion on 60 synthetic users).

Shared by the tests that damage trained files (``tests.reliability.test_artifact_integrity``,
``tests.serving.test_reliability_artifacts``) and signal a real server (``tests.serving.test_signals``):
~20 s on 2 cores, so the session fixture ``tiny_cascade`` (``tests/conftest.py``) trains it once into
a temporary directory and they copy it before writing. The two-tower fits under a logit budget, as
``recsys demo`` trains them: serving these artifacts with ``TINY_CONFIG`` (no budget) is the
demo's situation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from cascade.settings import Settings
from jobs.prepare import prepare
from jobs.train import train_stages

TINY_CONFIG: dict[str, Any] = {
    "recall": {"dim": 16, "max_len": 10, "n_blocks": 1, "n_heads": 1, "max_epochs": 4, "eval_every": 2,
               "use_text": False},
    "coarse": {"n_estimators": 20, "min_child_samples": 5, "early_stopping_rounds": 5, "train_positions": 2},
}
TRAINING_BUDGET = {"max_train_logits": 1e12}  # a bound the fits never reach: the model is the unbounded one


def trained_with() -> Settings:
    """The settings the tiny cascade is trained under (``TINY_CONFIG`` with ``TRAINING_BUDGET``)."""
    return Settings.build({**TINY_CONFIG, "recall": {**TINY_CONFIG["recall"], **TRAINING_BUDGET}})


def train_tiny_cascade(artifact_dir: Path) -> Settings:
    """Prepare and train the tiny cascade into ``artifact_dir``; the settings it is served with."""
    split = prepare(None, artifact_dir, n_users=60, n_items=120, seed=3)
    train_stages(trained_with(), artifact_dir, split, progress=False)
    return Settings.build(TINY_CONFIG)


def write_config(path: Path, **extra: Any) -> Path:
    """``TINY_CONFIG`` (plus ``extra`` sections) as a pipeline YAML for the CLI."""
    path.write_text(yaml.safe_dump({**TINY_CONFIG, **extra}))
    return path
