"""Every worked example in the product's docstrings runs: each module of a product package that
holds a ``>>>`` example is imported and its examples are checked with ``doctest``, one test per
module, so an example that no longer says what the code does fails the suite.

Importing a module loads no model (nothing heavy happens at import time), so this stays cheap.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def modules_with_examples() -> list[str]:
    """Dotted names of the product modules (every package beside ``tests``) holding a ``>>>`` line."""
    found = []
    for package in sorted(p for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name != "tests"):
        for path in sorted(package.rglob("*.py")):
            if any(line.lstrip().startswith(">>>") for line in path.read_text(encoding="utf-8").splitlines()):
                found.append(".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"))
    return found


MODULES = modules_with_examples()


def test_examples_are_found() -> None:
    assert len(MODULES) > 50 and "recsys.names" in MODULES and "offline.metrics" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    examples = sum(len(test.examples) for test in doctest.DocTestFinder().find(module))
    assert examples > 0, f"{name}: a '>>>' line outside any docstring doctest finds"
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed (output above)"
