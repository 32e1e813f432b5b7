"""``recsys battery``: the defaults over several dataset shapes, one table (``jobs.evaluation.battery``).

Each shape runs ``recsys eval`` in a child process with the given config; reports land in
``--work`` and are reused by a second run, so an interrupted battery resumes where it stopped.
The table (Markdown) is printed and, with ``--out``, the rows are written with their provenance.
Bad input is one ``error:`` line and exit 2: an unknown shape, a datasets folder that does not exist.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli import common as c

DEFAULT_DATASETS = Path("../shared/datasets")


def battery(
    shapes: Annotated[str | None, typer.Option(help="Comma-separated shapes (default: every shape).")] = None,
    seeds: Annotated[int, typer.Option(min=1, max=10, help="Seeds per shape (the cold-item protocol runs "
                                                           "once, for the first seed).")] = 3,
    datasets: Annotated[Path, typer.Option(help="Folder holding ml-100k/ and amazon-scientific/.")]
    = DEFAULT_DATASETS,
    work: Annotated[Path, typer.Option(help="Where shape data, artifacts and per-shape reports go.")]
    = Path("artifacts/battery"),
    config: c.ConfigOpt = None,
    out: c.OutOpt = None,
) -> None:
    """Run the defaults over dataset shapes unlike each other and print one table."""
    from jobs.evaluation.battery import SHAPES, battery_table, run_battery  # lazy: keeps `recsys --help` fast

    chosen = list(SHAPES) if shapes is None else [s.strip() for s in shapes.split(",") if s.strip()]
    if not chosen:
        c.fail(f"--shapes names no shape; known: {', '.join(SHAPES)}")
    unknown = [s for s in chosen if s not in SHAPES]
    if unknown:
        c.fail(f"unknown shape(s) {', '.join(map(repr, unknown))}; known: {', '.join(SHAPES)}")
    if not datasets.is_dir():
        c.fail(f"--datasets {datasets}: no such folder")
    settings = c.load_settings(config)  # a bad --config is refused before any shape runs
    rows = run_battery(chosen, datasets.resolve(), work.resolve(), seeds=seeds, config=config,
                       echo=lambda line: typer.echo(line, err=True))
    typer.echo(battery_table(rows))
    c.write_report({"seeds": seeds, "shapes": rows}, out, settings=settings, data=datasets,
                   seeds=[settings.seed + i for i in range(seeds)], show=False)
