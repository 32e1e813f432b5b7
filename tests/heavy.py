"""The marker of tests too long for ``make test``: they run with ``HEAVY_TESTS=1`` (``make test-heavy``).

A whole Ray job on a local cluster costs tens of seconds of start-up alone; ``make test`` keeps one
Ray path per stage (the two-tower's data-parallel fit, the coarse ranker's rows, the channel counts,
the evaluation pass) within the CI budget, and these run the rest end to end.
"""

from __future__ import annotations

import os

import pytest

HEAVY = pytest.mark.skipif(os.environ.get("HEAVY_TESTS") != "1",
                           reason="a whole job end to end (tens of seconds); run with HEAVY_TESTS=1 (make test-heavy)")
