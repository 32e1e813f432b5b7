"""One coarse ranker trained on the chain split, shared by the train and stage tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from coarse_rank.config import CoarseConfig
from coarse_rank.train import train_coarse
from offline.split import Split
from tests.coarse_rank.toy import PopularityStage, chain_split

TOY_CONFIG = CoarseConfig(n_estimators=60, min_child_samples=10, early_stopping_rounds=15, train_positions=1,
                          channel_features=False)  # the base features; tests/coarse_rank/test_channel_features.py covers the rest


@pytest.fixture(scope="session")
def chain() -> Split:
    return chain_split()


@pytest.fixture(scope="session")
def trained(chain: Split, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """(artifact root holding coarse/, training report)."""
    root = tmp_path_factory.mktemp("artifacts")
    report = train_coarse(chain, PopularityStage(chain), root / "coarse", TOY_CONFIG, seed=7, progress=False)
    return root, report
