"""The package layering: every package imports only packages below it, so the graph has no cycle.

Bottom to top (``README.md``, "Layout"): the core (``recsys``: stage contract, pipeline spec and
runner, digests, the Redis connection) → data (``offline``: schema, loaders, protocol, split,
metrics, bootstrap, the tag store) → the stages (``recall``, then ``coarse_rank``, ``llm_rerank``,
``rules``, ``fusion``) → the composition root (``cascade``: settings and the stage registry) →
``serving`` → ``jobs`` (preparation, training, evaluation, tagging, A/B) → ``bench`` (benchmarks and
probes) → ``cli``.
Imports inside functions count too: a lazy import still ties two packages together.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYERS: list[tuple[str, ...]] = [
    ("recsys",),
    ("offline",),
    ("recall",),
    ("coarse_rank", "llm_rerank", "rules", "fusion"),
    ("cascade",),
    ("serving",),
    ("jobs",),
    ("bench",),
    ("cli",),
]
LEVEL = {pkg: level for level, pkgs in enumerate(LAYERS) for pkg in pkgs}


def packages() -> set[str]:
    return {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name != "tests"}


def imports(pkg: str) -> list[tuple[str, int, str]]:
    """(file, line, imported top-level project package) for every import in ``pkg``."""
    found = []
    for path in sorted((ROOT / pkg).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            found += [(str(path.relative_to(ROOT)), node.lineno, n.split(".")[0]) for n in names
                      if n.split(".")[0] in LEVEL and n.split(".")[0] != pkg]
    return found


def test_every_package_has_a_layer():
    assert packages() == set(LEVEL), "add the new package to LAYERS (and to README's Layout)"


def test_no_package_imports_a_package_at_or_above_its_own_layer():
    wrong = [f"{file}:{line} ({pkg}, layer {LEVEL[pkg]}) imports {target} (layer {LEVEL[target]})"
             for pkg in sorted(LEVEL) for file, line, target in imports(pkg) if LEVEL[target] >= LEVEL[pkg]]
    assert not wrong, "\n".join(wrong)


def test_imports_inside_functions_say_why():
    """An import inside a function hides an edge from the reader: only for heavy or optional
    dependencies (torch, transformers, faiss, lightgbm, ... or what imports them), and with a
    ``# lazy: <reason>`` comment on the statement."""
    silent = []
    for pkg in sorted(LEVEL):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            lines = source.splitlines()
            for fn in ast.walk(ast.parse(source)):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)) and not any(
                            "# lazy:" in line for line in lines[node.lineno - 1 : node.end_lineno]):
                        silent.append(f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not sorted(set(silent)), "\n".join(sorted(set(silent)))
