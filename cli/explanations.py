"""``recsys bench explain``: reasons for recommended items, measured (``bench.explanations``);
``recsys tag explanations``: reasons precomputed into the serving Redis.

``cli.bench`` and ``cli.tag`` register the commands on their groups."""

from __future__ import annotations

from typing import Annotated

import typer

from cli import common as c


def bench_explain(
    data: c.DataOpt = None, config: c.ConfigOpt = None, artifacts: c.ArtifactsOpt = None,
    users: Annotated[int, typer.Option(min=1, help="Sampled users (requests per explain_k setting).")] = 40,
    explain_k: Annotated[str, typer.Option(help="explain_k settings, comma-separated.")] = "1,3",
    k: Annotated[int, typer.Option(min=1, help="Items per answer.")] = 10,
    budget_ms: Annotated[float, typer.Option(min=1.0, max=60_000.0, help="Generation budget of the benchmark (lifted so every "
                                                           "reason is written and checked).")] = 60_000.0,
    out: c.OutOpt = None,
) -> None:
    """Schema-valid and grounded shares, template share, extra ms per request, cache hit rate, sampled reasons."""
    from bench.explanations import bench_explanations  # lazy: loads torch and the serving stack

    try:
        ks = [int(v) for v in explain_k.split(",") if v.strip()]
    except ValueError:
        c.fail(f"--explain-k takes integers, comma-separated; got {explain_k!r}")
    if not ks or not all(1 <= v <= 20 for v in ks):
        c.fail(f"--explain-k values must be in 1..20; got {explain_k!r}")
    settings, art = c.trained(config, data, artifacts)
    if k > settings.pipeline.max_k:
        c.fail(f"--k must be at most pipeline.max_k ({settings.pipeline.max_k}); got {k}")
    try:
        report = bench_explanations(settings, art, users=users, explain_ks=ks, k=k, budget_ms=budget_ms,
                                    seed=settings.seed)
    except ValueError as exc:
        c.fail(str(exc))
    report["dataset"] = art.name
    c.write_report(report, out, settings=settings, data=data)


def tag_explanations(
    data: c.DataOpt = None, config: c.ConfigOpt = None, artifacts: c.ArtifactsOpt = None,
    users: Annotated[str | None, typer.Option(help="External user ids, comma-separated (default: every user).")]
    = None,
    k: Annotated[int, typer.Option(min=1, help="Items per answer.")] = 10,
    explain_k: Annotated[int | None, typer.Option(min=1, max=20, help="Top items given a reason (default 3).")]
    = None,
    out: c.OutOpt = None,
) -> None:
    """Precompute reasons for each user's current top items into the serving Redis (the reason cache
    requests read), so a deployment serves them without waiting for the model. Run it while the
    server is stopped when the server uses the embedded Redis."""
    from jobs.explanations import precompute_reasons  # lazy: loads torch and the serving stack
    from recsys.redis_server import StateDirInUse  # lazy: as above

    settings, art = c.trained(config, data, artifacts)
    chosen = None if users is None else [u.strip() for u in users.split(",") if u.strip()]
    if chosen is not None and not chosen:
        c.fail("--users names no user")
    try:
        report = precompute_reasons(settings, art, users=chosen, k=min(k, settings.pipeline.max_k),
                                    explain_k=explain_k)
    except (ValueError, StateDirInUse) as exc:  # a running server holds the embedded Redis: one line, exit 2
        c.fail(str(exc))
    c.write_report(report, out, settings=settings, data=data)
