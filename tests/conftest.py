"""Shared fixtures. Real data lives in ../shared (never in the repo).

``ml100k_dir`` and ``amazon_scientific_dir`` skip with a clear reason when the data set is absent (a user's fresh clone)
but fails when CI=true, so CI never skips the real-data tests silently. ``tiny_cascade`` is the one really trained
cascade that several packages' tests serve, damage or signal: trained once per session, copied by whoever writes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from cascade.settings import Settings

DATASETS = Path(__file__).resolve().parent.parent.parent / "shared" / "datasets"
ML100K = DATASETS / "ml-100k"
AMAZON_SCIENTIFIC = DATASETS / "amazon-scientific"


def _absent(msg: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{msg}; CI=true requires it")
    pytest.skip(msg)


@pytest.fixture(scope="session")
def ml100k_dir() -> Path:
    if (ML100K / "u.data").exists():
        return ML100K
    _absent(f"MovieLens-100K not found at {ML100K} (it lives in ../shared beside the clone)")
    return ML100K


@pytest.fixture(scope="session")
def amazon_scientific_dir() -> Path:
    if (AMAZON_SCIENTIFIC / "interactions.csv").exists():
        return AMAZON_SCIENTIFIC
    _absent(f"Amazon Scientific not found at {AMAZON_SCIENTIFIC} (it lives in ../shared beside the clone)")
    return AMAZON_SCIENTIFIC


@pytest.fixture(scope="session")
def tiny_cascade(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Settings]:
    """(artifact dir, serving settings) of ``tests.trained_cascade``'s tiny cascade, trained once per session
    (~20 s on 2 cores). Shared read-only: a test that writes under it (damages a file, serves with the
    Redis state folder inside) copies it first."""
    # imported here, not at the top: torch and LightGBM load only in the sessions that train
    from tests.trained_cascade import train_tiny_cascade

    art = tmp_path_factory.mktemp("tiny_cascade") / "synthetic"
    return art, train_tiny_cascade(art)
