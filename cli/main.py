"""The ``recsys`` console script: prepare, train, eval, serve, recommend, bench, demo.

Every command is a thin wrapper over a library function (``jobs.train``,
``jobs.evaluation.evaluate``, ``serving.run``, the bench modules), so the same work is callable from
Python and tests. Errors in user input exit with code 2 and one line naming the problem
(``common.fail``, and ``common.UserErrorGroup`` for what a library call raises on bad input).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from cli import common as c
from cli.ab import ab_app
from cli.battery import battery
from cli.bench import bench_app
from cli.tag import tag_app
from recsys.progress import quiet_library_bars

if TYPE_CHECKING:
    from cascade.settings import Settings
    from offline.split import Split

# torchao (imported by peft and transformers) logs that its kernels built for CUDA and another
# Python do not load, and torch warns about torchao's Enum registrations: harmless on this CPU
# path, and four lines of noise before the output of every command that loads a model.
for _noisy in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_noisy).setLevel(logging.ERROR)

app = typer.Typer(cls=c.UserErrorGroup, add_completion=False, no_args_is_help=True,
                  help="Hybrid recommender with LLM re-ranking.")
app.add_typer(bench_app, name="bench")
app.add_typer(ab_app, name="ab")
app.add_typer(tag_app, name="tag")
app.command("battery")(battery)

STAGES_HELP = ("Stages to train, comma-separated, from recall,recall_holdout,coarse,llm,fusion "
               "('all' = recall,recall_holdout,coarse,fusion).")


def _prepare(data: Path | None, fmt: str | None, artifacts: Path, k_core: int | None, users: int | None,
             items: int | None, settings: Settings, force: bool = False, catalog: str | None = None) -> Split:
    """The split of ``artifacts`` (``jobs.prepare.prepare``: an option left unset keeps the value the
    split was prepared with, when it was prepared from the same dataset); exit 2 on bad data."""
    from jobs.prepare import prepare  # lazy: keeps `recsys --help` fast
    from offline.schema import DataError  # lazy: keeps `recsys --help` fast

    synthetic = {} if data is not None else {"n_users": users, "n_items": items, "seed": settings.seed}
    try:
        return prepare(data, artifacts, fmt=fmt, k_core=k_core, catalog=catalog, force=force, **synthetic)
    except (DataError, FileNotFoundError, ValueError) as exc:
        return c.fail(str(exc))


@app.command()
def prepare(
    data: c.DataOpt = None, fmt: c.FormatOpt = None, config: c.ConfigOpt = None, artifacts: c.ArtifactsOpt = None,
    k_core: c.KCoreOpt = None, catalog: c.CatalogOpt = None, synthetic_users: c.SynthUsersOpt = None,
    synthetic_items: c.SynthItemsOpt = None,
    force: Annotated[bool, typer.Option(help="Rebuild even when the inputs are unchanged.")] = False,
    out: c.OutOpt = None,
) -> None:
    """Load a dataset, apply the protocol (k-core, leave-one-out) and save the split."""
    settings = c.load_settings(config)
    art = c.artifact_dir(settings, data, artifacts)
    split = _prepare(data, fmt, art, k_core, synthetic_users, synthetic_items, settings, force, catalog)
    c.write_report({"dataset": split.name, "artifacts": str(art), "n_users": split.n_users,
                    "n_items": split.n_items, "n_train": len(split.train), "protocol": split.protocol}, out,
                   settings=settings, data=data)


@app.command()
def train(
    stages: Annotated[str, typer.Argument(help=STAGES_HELP)] = "all",
    data: c.DataOpt = None, fmt: c.FormatOpt = None, config: c.ConfigOpt = None, artifacts: c.ArtifactsOpt = None,
    k_core: c.KCoreOpt = None, catalog: c.CatalogOpt = None, synthetic_users: c.SynthUsersOpt = None,
    synthetic_items: c.SynthItemsOpt = None,
    force: Annotated[bool, typer.Option(help="Retrain stages whose artifacts exist.")] = False,
    out: c.OutOpt = None, ray: c.RayOpt = None,
) -> None:
    """Train the cascade's stages in order (artifacts reused unless --force)."""
    from jobs.evaluation.fit_report import training_warnings  # lazy: keeps `recsys --help` fast
    from jobs.train import DEFAULT_STAGES, STAGE_ORDER, train_stages  # lazy: keeps `recsys --help` fast

    settings = c.load_settings(config, ray)
    c.on_cluster(settings)
    names = DEFAULT_STAGES if stages == "all" else tuple(s.strip() for s in stages.split(","))
    bad = [s for s in names if s not in STAGE_ORDER]
    if bad:
        c.fail(f"unknown stage(s) {bad}; choose from {list(STAGE_ORDER)}")
    art = c.artifact_dir(settings, data, artifacts)
    split = _prepare(data, fmt, art, k_core, synthetic_users, synthetic_items, settings, catalog=catalog)
    report = train_stages(settings, art, split, stages=names, force=force)
    c.write_report(report, out, settings=settings, data=data)
    for warning in training_warnings(settings, report):
        typer.echo(f"warning: {warning}", err=True)


@app.command("eval")
def evaluate(
    data: c.DataOpt = None, fmt: c.FormatOpt = None, config: c.ConfigOpt = None, artifacts: c.ArtifactsOpt = None,
    k_core: c.KCoreOpt = None, catalog: c.CatalogOpt = None, synthetic_users: c.SynthUsersOpt = None,
    synthetic_items: c.SynthItemsOpt = None,
    phase: Annotated[Literal["valid", "test"], typer.Option(help="The split part measured.")] = "test",
    retrain: Annotated[bool, typer.Option(help="Retrain every stage first.")] = False,
    seeds: Annotated[int, typer.Option(min=1, help="Train and evaluate N times (seeds s, s+1, ... in "
                                       "<artifacts>/seed-<s>/, one split); report mean, sd, per seed.")] = 1,
    cold_items: Annotated[bool, typer.Option(help="Also train a cascade without the items first seen after a "
                                                  "cutoff and report their slice (jobs.evaluation.cold_items; with --seeds, once, for the "
                                                  "first seed).")] = True,
    cold_share: Annotated[float, typer.Option(min=0.01, max=0.5, help="Share of items made new by the cutoff.")]
    = 0.1,
    out: Annotated[Path | None, typer.Option(
        "--out", dir_okay=False, callback=c.writable_path,
        help="Write the full JSON report here (default: eval_<phase>.json in the artifacts directory).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the full JSON report on stdout instead of the "
                                                          "summary.")] = False,
    ray: c.RayOpt = None,
) -> None:
    """Train (or reuse) every stage, then measure each stage and the fused result.

    Prints a summary (per stage NDCG@10 and Recall@10 with 95% CIs, candidate recall, users evaluated
    and left out, warnings); the full report goes to --out.
    """
    from jobs.evaluation.eval_summary import summary  # lazy: keeps `recsys --help` fast
    from jobs.evaluation.evaluate import require_bootstrap_users  # lazy: keeps `recsys --help` fast
    from jobs.train import DEFAULT_STAGES  # lazy: keeps `recsys --help` fast

    settings = c.load_settings(config, ray)
    c.on_cluster(settings)
    art = c.artifact_dir(settings, data, artifacts)
    split = _prepare(data, fmt, art, k_core, synthetic_users, synthetic_items, settings, catalog=catalog)
    try:
        require_bootstrap_users(split)  # before any training: a split too small to evaluate wastes none
    except ValueError as exc:
        c.fail(str(exc))
    wanted = DEFAULT_STAGES + (("llm",) if _llm_enabled(settings) else ())
    if seeds > 1:
        from jobs.evaluation.seeds import evaluate_seeds  # lazy: keeps `recsys --help` fast

        report = evaluate_seeds(settings, art, split, n_seeds=seeds, stages=wanted, phase=phase, retrain=retrain)
        runs = {f"seed {s}": r for s, r in report["per_seed"].items()}
        if cold_items:
            first = runs[f"seed {settings.seed}"]
            first["warnings"] = first.get("warnings", []) + _cold_items(report, settings, art / f"seed-{settings.seed}",
                                                                        split, cold_share, phase)
    else:
        report = _evaluate_once(settings, art, split, wanted, phase=phase, retrain=retrain,
                                cold_share=cold_share if cold_items else None)
        runs = {"": report}
    out = out or art / f"eval_{phase}.json"
    c.write_report(report, out, settings=settings, data=data, seeds=[settings.seed + i for i in range(seeds)],
                   show=json_out)
    if not json_out:
        typer.echo(summary(report, out))
    _warn_and_guard(runs)



def _evaluate_once(settings: Settings, art: Path, split: Split, wanted: tuple[str, ...], *, phase: Literal["valid", "test"],
                   retrain: bool, cold_share: float | None) -> dict[str, Any]:
    """Train (or reuse) ``wanted``, evaluate on ``phase``; with ``cold_share``, the cold-item slice too.
    The report carries the training times, the two-tower fits and every warning."""
    from jobs.evaluation.baselines import baseline_warnings  # lazy: keeps `recsys --help` fast
    from jobs.evaluation.evaluate import evaluate_pipeline  # lazy: keeps `recsys --help` fast
    from jobs.evaluation.fit_report import (  # lazy: keeps --help fast
        fit_summary,
        served_choices,
        training_warnings,
    )
    from jobs.train import train_stages  # lazy: keeps `recsys --help` fast

    train_report = train_stages(settings, art, split, stages=wanted, force=retrain)
    report = evaluate_pipeline(settings, art, split, phase=phase)
    report["timings"]["train_s"] = {k: v.get("seconds") for k, v in train_report.items()}
    report["recall_train"] = fit_summary(train_report)
    report["choices"] = served_choices(settings, art)
    report["warnings"] = training_warnings(settings, train_report) + baseline_warnings(report)
    if cold_share is not None:
        report["warnings"] += _cold_items(report, settings, art, split, cold_share, phase)
    return report


def _cold_items(report: dict[str, Any], settings: Settings, art: Path, split: Split, share: float,
                phase: Literal["valid", "test"]) -> list[str]:
    """Put the cold-item protocol's section in ``report`` (trained in ``art``); its warnings."""
    from jobs.evaluation.cold_items import clockless, cold_item_report  # lazy: keeps `recsys --help` fast

    if clockless(split):
        report["cold_items"] = {"skipped": CLOCKLESS_NOTE}
        return [CLOCKLESS_NOTE]
    report["cold_items"] = cold_item_report(settings, art, split, share=share, phase=phase)
    return list(report["cold_items"]["warnings"])  # every fit the eval makes is checked


CLOCKLESS_NOTE = ("the cold-item protocol was skipped: this dataset's timestamps only order each user's events "
                  "(positions, no clock), so a time cutoff for new items means nothing here")
EMPTY_LIST_LIMIT = 0.01  # share of users with an empty final list above which `eval` fails


def _warn_and_guard(runs: dict[str, dict[str, Any]]) -> None:
    """Print each run's training warnings, then exit 1 when any run gave more than ``EMPTY_LIST_LIMIT``
    of its users an empty final list (the README's guard: a rule set this catalog cannot satisfy).

    ``runs`` maps a label to an eval report: ``""`` for a single run, ``"seed <s>"`` for each
    ``per_seed`` report of ``--seeds N``, so both paths warn and fail alike. ``eval`` calls it after
    writing the report, which a failing run still leaves for CI to read.
    """
    for label, run in runs.items():
        for warning in run.get("warnings", []):
            typer.echo(f"warning: {label + ': ' if label else ''}{warning}", err=True)
    over = {label: run["lists"] for label, run in runs.items() if run["lists"]["empty_share"] > EMPTY_LIST_LIMIT}
    if over:
        counts = ", ".join(f"{x['empty']} of {x['users']} users ({x['empty_share']:.1%}){' in ' + label if label else ''}"
                           for label, x in over.items())
        where = "" if "" in runs else " under 'per_seed'"
        typer.echo(f"error: {counts} got an empty list (limit {EMPTY_LIST_LIMIT:.0%}); see 'lists' and 'policy_costs'"
                   f"{where} in the report: a rule probably removes what this catalog cannot satisfy", err=True)
        raise typer.Exit(1)


def _llm_enabled(settings: Settings) -> bool:
    return any(s.kind == "llm" and s.enabled for s in settings.pipeline.stages)


@app.command()
def serve(
    data: c.DataOpt = None, config: c.ConfigOpt = None, artifacts: c.ArtifactsOpt = None,
    host: Annotated[str | None, typer.Option(help="Bind address (default from settings).")] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65535, help="Port (default from settings).")] = None,
    workers: Annotated[int | None, typer.Option(min=1, max=64, help="uvicorn worker processes.")] = None,
) -> None:
    """Serve POST /v1/recommend over HTTP from trained artifacts.

    The /admin routes (rules, prompts, reload) need a key: set RECSYS_SERVING__ADMIN_API_KEY (or
    serving.admin_api_key in --config); clients send it as the X-API-Key header. Without a key
    the admin routes answer 503.
    """
    from recsys.redis_server import StateDirInUse  # lazy: keeps `recsys --help` fast
    from serving.run import serve as run_server  # lazy: as above

    settings, art = c.trained(config, data, artifacts)
    c.servable(settings, art)  # before the workers start: a stale stage would make every request a 503
    try:
        run_server(settings, art, host, port, workers)
    except StateDirInUse as exc:  # another server on these artifacts holds their Redis state
        c.fail(str(exc))


@app.command()
def recommend(
    user: Annotated[str, typer.Argument(help="External user id.")],
    k: Annotated[int, typer.Option(min=1, help="How many items.")] = 10,
    debug: Annotated[bool, typer.Option(help="Include per-stage scores and rule removals.")] = False,
    explain: Annotated[bool, typer.Option(help="Give the top items a reason (written by the LLM, checked, "
                                               "else a template; see docs/explanations.md).")] = False,
    explain_k: Annotated[int | None, typer.Option(help="How many top items get a reason (default 3).")] = None,
    data: c.DataOpt = None, config: c.ConfigOpt = None, artifacts: c.ArtifactsOpt = None,
) -> None:
    """Answer one recommendation request from the shell (same JSON as the HTTP endpoint)."""
    from serving.run import recommend_once  # lazy: keeps `recsys --help` fast

    settings, art = c.trained(config, data, artifacts)
    c.write_report(recommend_once(settings, art, user, k, debug, explain=explain, explain_k=explain_k), None)


@app.command()
def demo(
    artifacts: c.ArtifactsOpt = None, config: c.ConfigOpt = None,
    synthetic_users: c.SynthUsersOpt = 600, synthetic_items: c.SynthItemsOpt = 1200,
) -> None:
    """Synthetic data -> train every stage -> start the server -> send a request -> stop."""
    from cli.demo import run_demo  # lazy: keeps `recsys --help` fast
    from jobs.prepare import SYNTHETIC_DEFAULTS  # lazy: keeps `recsys --help` fast

    settings = c.load_settings(config)
    art = c.artifact_dir(settings, None, artifacts)
    run_demo(settings, art, config, synthetic_users or SYNTHETIC_DEFAULTS["n_users"],
             synthetic_items or SYNTHETIC_DEFAULTS["n_items"])


def main() -> None:
    quiet_library_bars()  # before any command imports transformers: off a terminal, no progress frames
    app()


if __name__ == "__main__":
    main()
