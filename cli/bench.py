"""``recsys bench ...``: benchmark commands; each writes a JSON report to ``--out``."""

from __future__ import annotations

from typing import Annotated, Literal

import typer

from cli import common as c
from recall.bench import bench_recall as run_bench_recall

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks that write JSON reports.")


@bench_app.command("recall")
def bench_recall(
    items: Annotated[int, typer.Option(min=1000, help="Synthetic item vectors.")] = 1_000_000,
    dim: Annotated[int, typer.Option(min=8, help="Vector dimension (the two-tower model's).")] = 64,
    index: Annotated[Literal["hnsw", "ivf"], typer.Option(help="Index kind (flat is the exact reference).")] = "hnsw",
    queries: Annotated[int, typer.Option(min=10, help="Queries for the ANN latency.")] = 1000,
    out: c.OutOpt = None,
) -> None:
    """Faiss ANN vs exact search on synthetic vectors: build time, memory, recall@100, latency."""
    c.write_report(run_bench_recall(n_items=items, dim=dim, kind=index, n_queries=queries), out)


@bench_app.command("lists")
def bench_lists(
    data: c.DataOpt = None, config: c.ConfigOpt = None, artifacts: c.ArtifactsOpt = None,
    k: Annotated[str, typer.Option(help="List lengths, comma-separated.")] = "10,20,50",
    out: c.OutOpt = None,
) -> None:
    """Every user's test request at each k through the served pipeline: complete, short and empty lists."""
    from jobs.evaluate import list_lengths  # lazy: keeps `recsys --help` fast
    from offline.split import Split  # lazy: keeps `recsys --help` fast

    try:
        ks = [int(x) for x in k.split(",")]
    except ValueError:
        c.fail(f"--k must be comma-separated integers, got {k!r}")
    settings, art = c.trained(config, data, artifacts)
    if any(x < 1 or x > settings.pipeline.max_k for x in ks):
        c.fail(f"--k values must be in 1..{settings.pipeline.max_k} (pipeline.max_k), got {k!r}")
    c.write_report(list_lengths(settings, art, Split.load(art / "split"), ks), out, settings=settings, data=data)


@bench_app.command("serve")
def bench_serve(
    data: c.DataOpt = None, config: c.ConfigOpt = None, artifacts: c.ArtifactsOpt = None,
    seconds: Annotated[float, typer.Option(min=0.5, help="Duration of each light / cache-mix run.")] = 10.0,
    concurrency: Annotated[str, typer.Option(help="Concurrent clients of the light and cache-mix runs, "
                                                  "comma-separated.")] = "1,4,8",
    llm_concurrency: Annotated[str, typer.Option(help="Concurrent clients of the LLM-path rows.")] = "1,4",
    llm_users: Annotated[int, typer.Option(min=1, help="Users per LLM row (each: one cold, one warm call).")] = 16,
    llm_share: Annotated[str, typer.Option(help="serving.llm_share of the cache-mix runs, comma-separated (one "
                                                "server each; above 0 needs an LLM stage in --config).")] = "0",
    max_requests: Annotated[int, typer.Option(min=1, help="Cap on calls per run.")] = 200_000,
    out: c.OutOpt = None,
) -> None:
    """Light path without the result cache, LLM path (cold and warm prefix) with the LLM loaded, cache mix.

    The LLM rows need an enabled LLM stage (--config configs/pipeline_llm.yaml); see serving.bench.
    """
    from offline.split import Split  # lazy: keeps `recsys --help` fast
    from serving.bench import bench_serve as run  # lazy: keeps `recsys --help` fast

    try:
        levels = [int(v) for v in concurrency.split(",") if v.strip()]
        llm_levels = [int(v) for v in llm_concurrency.split(",") if v.strip()]
        shares = [float(v) for v in llm_share.split(",") if v.strip()]
    except ValueError:
        c.fail(f"--concurrency/--llm-concurrency take integers and --llm-share numbers, comma-separated; got "
               f"{concurrency!r}, {llm_concurrency!r}, {llm_share!r}")
    if (not levels or min(levels) < 1 or not llm_levels or min(llm_levels) < 1 or not shares
            or not all(0.0 <= s <= 1.0 for s in shares)):
        c.fail(f"concurrency values must be >= 1 and --llm-share values in [0, 1]; got {levels}, {llm_levels}, "
               f"{shares}")
    settings, art = c.trained(config, data, artifacts)
    split = Split.load(art / "split")
    users = [str(u) for u in split.vocab.user_ids]
    items = [str(i) for i in split.vocab.item_ids]
    report = run(settings, art, users, items, seconds=seconds, concurrencies=levels, llm_concurrencies=llm_levels,
                 llm_users=llm_users, llm_shares=shares, max_requests=max_requests)
    report["dataset"] = art.name
    c.write_report(report, out, settings=settings, data=data)


import cli.bench_llm  # noqa: E402, F401  (registers `bench llm` on bench_app)
import cli.soak  # noqa: E402, F401  (registers `bench soak` on bench_app)
