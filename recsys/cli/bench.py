"""``recsys bench ...``: benchmark commands; each writes a JSON report to ``--out``."""

from __future__ import annotations

from typing import Annotated

import typer

from recsys.cli import common as c

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks that write JSON reports.")


@bench_app.command("recall")
def bench_recall(
    items: Annotated[int, typer.Option(min=1000, help="Synthetic item vectors.")] = 1_000_000,
    dim: Annotated[int, typer.Option(min=8, help="Vector dimension (the two-tower model's).")] = 64,
    index: Annotated[str, typer.Option(help="hnsw or ivf (flat is the exact reference).")] = "hnsw",
    queries: Annotated[int, typer.Option(min=10, help="Queries for the ANN latency.")] = 1000,
    out: c.OutOpt = None,
) -> None:
    """Faiss ANN vs exact search on synthetic vectors: build time, memory, recall@100, latency."""
    from recall.bench import bench_recall as run

    if index not in ("hnsw", "ivf"):
        c.fail(f"--index must be hnsw or ivf, got {index!r}")
    c.write_report(run(n_items=items, dim=dim, kind=index, n_queries=queries), out)


@bench_app.command("serve")
def bench_serve(
    data: c.DataOpt = None, config: c.ConfigOpt = None, artifacts: c.ArtifactsOpt = None,
    requests: Annotated[int, typer.Option(min=1, help="Requests to send.")] = 1000,
    concurrency: Annotated[int, typer.Option(min=1, max=64, help="Concurrent clients.")] = 1,
    out: c.OutOpt = None,
) -> None:
    """Start the server on loopback, send requests for real users, report latency percentiles."""
    from offline.split import Split
    from serving.bench import bench_latency, start_server_subprocess

    settings = c.load_settings(config)
    art = c.artifact_dir(settings, data, artifacts)
    if not (art / "split").exists():
        c.fail(f"{art}: no trained artifacts here; run `recsys train --data ...` first")
    users = [str(u) for u in Split.load(art / "split").vocab.user_ids]
    with start_server_subprocess(settings, art) as base_url:
        report = bench_latency(base_url, users, n_requests=requests, concurrency=concurrency)
    report["dataset"] = art.name
    c.write_report(report, out)
