"""``recsys bench ...``: benchmark commands; each writes a JSON report to ``--out``.

``reliability`` runs ``serving.reliability.report`` (real servers, only copies of the artifacts
damaged) and writes one result file with its provenance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from bench.recall_index import bench_recall as run_bench_recall
from cli import common as c
from cli.bench_llm import bench_llm, bench_llm_probe, bench_llm_rerank
from cli.explanations import bench_explain
from cli.soak import bench_soak

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
    from jobs.evaluation.evaluate import list_lengths  # lazy: keeps `recsys --help` fast
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
    workers: Annotated[int, typer.Option(min=1, max=64, help="uvicorn worker processes of the light and "
                                                             "cache-mix servers.")] = 1,
    llm_precisions: Annotated[str, typer.Option(help="LLM precisions to serve side by side, comma-separated "
                                                     "(fp32,bf16,int8): the LLM rows again at each, one server "
                                                     "each, with the model's own forward time (the floor).")] = "",
    out: c.OutOpt = None,
) -> None:
    """Light path without the result cache, LLM path (cold and warm prefix) with the LLM loaded, cache mix.

    The LLM rows need an enabled LLM stage (--config configs/pipeline_llm.yaml); see bench.serving. int8
    is calibrated next to --out (else under /tmp/recsys-bench-serve) unless llm.int8_dir names a model.
    """
    from bench.serving import bench_serve as run  # lazy: keeps `recsys --help` fast
    from offline.split import Split  # lazy: keeps `recsys --help` fast

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
    precisions = [v.strip() for v in llm_precisions.split(",") if v.strip()]
    if not set(precisions) <= {"fp32", "bf16", "int8"} or len(set(precisions)) < len(precisions):
        c.fail(f"--llm-precisions takes fp32, bf16, int8 (each once), comma-separated; got {llm_precisions!r}")
    settings, art = c.trained(config, data, artifacts)
    if precisions and not any(s.enabled and s.kind == "llm" for s in settings.pipeline.stages):
        c.fail("--llm-precisions needs an enabled LLM stage in --config (try configs/pipeline_llm.yaml)")
    split = Split.load(art / "split")
    users = [str(u) for u in split.vocab.user_ids]
    items = [str(i) for i in split.vocab.item_ids]
    report = run(settings, art, users, items, seconds=seconds, concurrencies=levels, llm_concurrencies=llm_levels,
                 llm_users=llm_users, llm_shares=shares, max_requests=max_requests, llm_precisions=precisions,
                 workers=workers, work_dir=out.parent / f"{out.stem}-work" if out is not None else None)
    report["dataset"] = art.name
    c.write_report(report, out, settings=settings, data=data)


@bench_app.command("reliability")
def bench_reliability(
    artifacts: Annotated[Path, typer.Option("--artifacts", exists=True, file_okay=False,
                                            help="A trained artifact directory (only copies are damaged).")],
    config: c.ConfigOpt = None,
    only: Annotated[str, typer.Option(help="Groups to run, comma-separated: rules, artifacts, events.")]
        = "rules,artifacts,events",
    requests: Annotated[int, typer.Option(min=1, help="Answers checked under concurrent publishes.")] = 10_000,
    trials: Annotated[int, typer.Option(min=1, help="Publish-then-kill trials.")] = 20,
    events: Annotated[int, typer.Option(min=1, help="Events posted before Redis is killed.")] = 1_600,
    flood_seconds: Annotated[float, typer.Option(min=0.5, max=3600.0, help="Length of each anonymous flood.")]
        = 20.0,
    flood_users: Annotated[int, typer.Option(min=1, help="Made-up user ids of the flood.")] = 10_000,
    work_dir: Annotated[Path | None, typer.Option(
        "--work-dir", help="Keep the runs' copies, logs and Redis state here (default: a temporary folder, "
                           "removed).", callback=c.writable_folder)] = None,
    out: c.OutOpt = None,
) -> None:
    """Reliability runs against real servers: concurrent publishes, publish then kill, damaged artifacts,
    events across a Redis crash, an anonymous flood. Each run failing is recorded, not fatal."""
    from serving.reliability.report import GROUPS, Sizes, run_report  # lazy: keeps `recsys --help` fast

    groups = [g.strip() for g in only.split(",") if g.strip()]
    if not groups or sorted(set(groups) - set(GROUPS)):
        c.fail(f"--only takes groups among {', '.join(GROUPS)}, comma-separated; got {only!r}")
    if not (artifacts / "split").exists():
        c.fail(f"{artifacts}: no split here; give a trained artifact directory (`recsys train` makes one)")
    settings = c.load_settings(config)
    c.servable(settings, artifacts)  # stages trained on another split, or damaged: one line now
    from cascade.registry import build_pipeline  # lazy: imports the stage modules

    try:  # an untrained stage: one line now, not a failed server in every run
        build_pipeline(settings, artifacts)
    except Exception as exc:  # any load failure is the artifacts' fault here, and said as such
        c.fail(f"{artifacts}: the pipeline does not load: {type(exc).__name__}: {exc}")
    sizes = Sizes(requests=requests, trials=trials, events=events, flood_seconds=flood_seconds,
                  flood_users=flood_users)
    report = run_report(artifacts, only=groups, sizes=sizes, settings=settings, config=config, work_dir=work_dir,
                        progress=lambda step: typer.echo(f"running {step}", err=True))
    for failed in report["errors"]:
        typer.secho(f"warning: {failed} failed: {_error_of(report, failed)}", fg=typer.colors.YELLOW, err=True)
    c.write_report(report, out, settings=settings, show=False)


def _error_of(report: dict, dotted: str) -> str:
    group, name = dotted.split(".", 1)
    return str(report[group][name]["error"])


# The commands of their own modules, listed after this module's own in `recsys bench --help`.
bench_app.command("explain")(bench_explain)
bench_app.command("llm")(bench_llm)
bench_app.command("llm-probe")(bench_llm_probe)
bench_app.command("llm-rerank")(bench_llm_rerank)
bench_app.command("soak")(bench_soak)
