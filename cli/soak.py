"""``recsys bench soak``: hold a concurrency against the server for a while (``bench.soak``).

``cli.bench`` registers the command on its ``bench`` group.
"""

from __future__ import annotations

from typing import Annotated

import typer

from cli import common as c


def bench_soak(
    data: c.DataOpt = None, config: c.ConfigOpt = None, artifacts: c.ArtifactsOpt = None,
    concurrency: Annotated[int, typer.Option(min=1, max=256, help="Concurrent closed-loop clients.")] = 8,
    seconds: Annotated[float, typer.Option(min=1.0, max=86_400, help="Measured duration.")] = 60.0,
    max_requests: Annotated[int, typer.Option(min=1, help="Cap on calls (the run ends at either bound).")]
    = 1_000_000,
    window: Annotated[float, typer.Option(min=1.0, help="Seconds per latency window in the report.")] = 10.0,
    warmup: Annotated[float, typer.Option(min=0.0, help="Seconds of load before the start RSS is read.")] = 5.0,
    out: c.OutOpt = None,
) -> None:
    """Soak the server on loopback: errors, p50/p99 per window, server RSS at start and end (JSON)."""
    from bench.soak import soak  # lazy: keeps `recsys --help` fast
    from offline.split import Split  # lazy: keeps `recsys --help` fast

    settings, art = c.trained(config, data, artifacts)
    split = Split.load(art / "split")
    report = soak(settings, art, [str(u) for u in split.vocab.user_ids], [str(i) for i in split.vocab.item_ids],
                  concurrency=concurrency, seconds=seconds, max_requests=max_requests, window_s=window,
                  warmup_s=warmup)
    report["dataset"] = art.name
    c.write_report(report, out, settings=settings, data=data)
