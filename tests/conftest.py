"""Shared fixtures. Real data lives in ../shared (never in the repo).

``ml100k_dir`` skips with a clear reason when the data set is absent (a user's fresh clone)
but fails when CI=true, so CI never skips the real-data tests silently.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ML100K = Path(__file__).resolve().parent.parent.parent / "shared" / "datasets" / "ml-100k"


@pytest.fixture(scope="session")
def ml100k_dir() -> Path:
    if (ML100K / "u.data").exists():
        return ML100K
    msg = f"MovieLens-100K not found at {ML100K} (it lives in ../shared beside the clone)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{msg}; CI=true requires it")
    pytest.skip(msg)
