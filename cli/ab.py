"""``recsys ab ...``: offline A/B of two configs, online log analysis, replay simulation.

``offline`` ranks the same test users with two pipeline YAMLs; ``analyze`` reads the event
log (Redis stream or Parquet) and tests CTR / conversion per variant with an SRM check;
``replay-dir`` builds the serving directory the simulator needs (test items hidden) and
``simulate`` drives a loopback server with held-out users. Each writes a JSON report to
``--out``; ``--report-dir`` adds Markdown plus PNG plots.

Reports are strict JSON: a number a run leaves undefined (NaN, an infinity) is written as
``null``. Bad input is one ``error:`` line and exit 2 (``cli.common.fail``): shares given to
``--expected`` that are not finite, negative or all zero, a Redis that cannot be reached or
read, a simulation server that does not answer or refuses every request, a replay directory
given to ``simulate`` as the targets' split (``--artifacts`` is the original), an event log with no
arm but the holdout, and (``offline``) stages trained on another split than the one measured,
as ``serve`` refuses them. Warnings (stages trained under other settings than a variant's
config, empty or short lists, clicks without an impression, a simulation that showed not one target,
an event stream missing events serving accepted, with the counts) go to stderr and the report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import typer
from pydantic import ValidationError

from cli import common as c
from recsys.experiments import ExperimentsConfig

ab_app = typer.Typer(no_args_is_help=True, help="A/B evaluation: offline comparison, online analysis, replay.")
ReportDirOpt = Annotated[Path | None, typer.Option("--report-dir", help="Write Markdown + PNG plots here.",
                                                  callback=c.writable_folder)]
REDIS_CONNECT_TIMEOUT_S = 10.0  # an unroutable --redis-url fails in this long instead of hanging


def _write_report(report: dict[str, Any], out: Path | None) -> None:
    c.write_report(report, out)


def _split_of(art: Path) -> Any:
    from offline.split import Split  # lazy: keeps `recsys --help` fast

    if not (art / "split").exists():
        c.fail(f"{art}: no split here; run `recsys prepare/train --data ...` first")
    return Split.load(art / "split")


@ab_app.command("offline")
def offline(
    a: Annotated[Path, typer.Option("--a", exists=True, dir_okay=False, help="Pipeline YAML of variant A.")],
    b: Annotated[Path, typer.Option("--b", exists=True, dir_okay=False, help="Pipeline YAML of variant B.")],
    data: c.DataOpt = None, artifacts: c.ArtifactsOpt = None,
    artifacts_b: Annotated[Path | None, typer.Option(
        "--artifacts-b", exists=True, file_okay=False,
        help="B's own trained artifacts (same split), when B changes a trained stage's settings "
             "(default: A's).")] = None,
    names: Annotated[str, typer.Option(help="Names of the two variants, comma-separated.")] = "A,B",
    n_boot: Annotated[int, typer.Option(min=100, help="Bootstrap resamples.")] = 2000,
    out: c.OutOpt = None, report_dir: ReportDirOpt = None,
) -> None:
    """Both configs on the same test users: metrics, lists, latency, LLM cost, paired CIs of B - A.

    Refuses stages trained on another split (as `serve` does) and warns when a recall or coarse
    stage was trained under other settings than a variant's config.
    """
    from jobs.ab.compare import compare_offline  # lazy: keeps `recsys --help` fast

    settings_a, settings_b = c.load_settings(a), c.load_settings(b)
    pair = tuple(n.strip() for n in names.split(","))
    if len(pair) != 2 or not all(pair) or pair[0] == pair[1]:
        c.fail(f"--names takes two distinct names, got {names!r}")
    art = c.artifact_dir(settings_a, data, artifacts)
    split = _split_of(art)
    try:
        report = compare_offline(settings_a, settings_b, art, split, names=pair,  # type: ignore[arg-type]
                                 n_boot=n_boot, progress=True, artifact_dir_b=artifacts_b)
    except ValueError as exc:  # StaleArtifacts, B's artifacts on another split
        c.fail(str(exc))
    latencies = report.pop("latencies_ms")
    report = c.strict_json(report)  # the Markdown and the JSON show the same (NaN -> None)
    for name, path in zip(pair, (a, b), strict=True):
        report["variants"][name]["config"] = str(path)
    for warning in report["warnings"]:
        typer.secho(f"warning: {warning}", fg=typer.colors.YELLOW, err=True)
    if report_dir is not None:
        from jobs.ab.report import write_offline_report  # lazy: keeps `recsys --help` fast

        typer.echo(f"report written to {write_offline_report(report, report_dir, latencies)}", err=True)
    _write_report(report, out)


def _parse_expected(expected: str) -> dict[str, float]:
    """``--expected name=share,...``: distinct names, shares finite and >= 0 with a positive sum."""
    from jobs.ab.stats import check_shares  # lazy: keeps `recsys --help` fast

    shares: dict[str, float] = {}
    for kv in (kv for kv in expected.split(",") if kv.strip()):
        name, sep, share = kv.partition("=")
        name = name.strip()
        try:
            value = float(share)
        except ValueError:
            value = None
        if not sep or not name or value is None:
            return c.fail(f"--expected takes name=share pairs, comma-separated; got {expected!r}")
        if name in shares:
            return c.fail(f"--expected names {name!r} twice in {expected!r}")
        shares[name] = value
    try:
        check_shares(shares, "--expected")
    except ValueError as exc:
        return c.fail(str(exc))
    return shares


def _expected(config: Path | None, expected: str | None) -> dict[str, float] | None:
    if expected:
        return _parse_expected(expected)
    if config is None:
        return None
    from cascade.settings import ConfigError, read_yaml_mapping  # lazy: keeps `recsys --help` fast

    try:
        document = read_yaml_mapping(config)
    except ConfigError as exc:
        c.fail(str(exc))
    section = document.get("experiments")
    if section is None:
        c.fail(f"{config}: no `experiments:` section")
    try:
        return ExperimentsConfig.model_validate(section).shares()
    except ValidationError as exc:
        c.fail(f"{config}: experiments: " + "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors()))
    return None


@ab_app.command("analyze")
def analyze(
    redis_url: Annotated[str | None, typer.Option(help="Read the events stream from this Redis.")] = None,
    namespace: Annotated[str | None, typer.Option(help="Redis key namespace (serving.redis_namespace, "
                                                  "default the artifact directory name).")] = None,
    events: Annotated[Path | None, typer.Option("--events", exists=True, dir_okay=False,
                                                help="Read an exported Parquet log instead.")] = None,
    export: Annotated[Path | None, typer.Option(help="Also write the log read to this Parquet file.",
                                                dir_okay=False, callback=c.writable_path)] = None,
    config: c.ConfigOpt = None,
    expected: Annotated[str | None, typer.Option(help="Configured shares, e.g. control=0.5,treatment=0.5 "
                                                 "(default: the config's experiments section).")] = None,
    control: Annotated[str | None, typer.Option(help="Control arm (default: the first configured variant).")] = None,
    ledger: Annotated[Path | None, typer.Option(
        "--ledger", exists=True, dir_okay=False,
        help="Serving's events ledger (<artifacts>/state/events-ledger.json): also count the events a reset "
             "Redis lost before any server ran on it again.")] = None,
    out: c.OutOpt = None, report_dir: ReportDirOpt = None,
) -> None:
    """CTR and conversion per variant with Wilson CIs, z-tests, lift and the sample-ratio check.

    Read from Redis, the report also says how many of the events serving accepted the stream no
    longer holds (trimmed by its length cap, lost by a Redis crash or reset), with a warning.
    """
    from jobs.ab.analyze import analyze_events  # lazy: keeps `recsys --help` fast
    from jobs.ab.events import export_parquet, load_parquet  # lazy: keeps `recsys --help` fast

    if (redis_url is None) == (events is None):
        c.fail("give exactly one of --redis-url (with --namespace) or --events FILE.parquet")
    if redis_url is not None and not namespace:
        c.fail("--redis-url needs --namespace (the serving namespace, e.g. the dataset name)")
    shares = _expected(config, expected)  # refused before anything is read or written
    stream: dict[str, Any] | None = None
    if events is not None:
        log, read_warnings = load_parquet(events), []
    else:
        log, stream = _read_redis(str(redis_url), str(namespace), ledger)
        read_warnings = [w] if (w := _integrity_warning(str(namespace), stream)) else []
    if export is not None:
        typer.echo(f"events exported to {export_parquet(log, export)}", err=True)
    try:
        report = c.strict_json(analyze_events(log, shares, control))
    except ValueError as exc:
        for warning in read_warnings:  # a lost or reset stream is said even when nothing is left to analyse
            typer.secho(f"warning: {warning}", fg=typer.colors.YELLOW, err=True)
        c.fail(str(exc))
    report["warnings"] = [*read_warnings, *report["warnings"]]
    if stream is not None:
        report["event_stream"] = stream
    for warning in report["warnings"]:
        typer.secho(f"warning: {warning}", fg=typer.colors.YELLOW, err=True)
    if report_dir is not None:
        from jobs.ab.report import write_online_report  # lazy: keeps `recsys --help` fast

        typer.echo(f"report written to {write_online_report(report, report_dir)}", err=True)
    _write_report(report, out)


def _redacted(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``, for error messages."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.netloc.rpartition("@")[2]
        return parts._replace(netloc=f"{parts.username or ''}:***@{host}").geturl()
    except ValueError:
        return "<unparsable URL>"


def _integrity_warning(namespace: str, stream: dict[str, Any]) -> str | None:
    from jobs.ab.integrity import integrity_warning  # lazy: keeps `recsys --help` fast

    return integrity_warning(namespace, stream)


def _read_redis(url: str, namespace: str, ledger: Path | None) -> tuple[Any, dict[str, Any]]:
    """The events stream of ``namespace`` at ``url`` and its integrity counts (``jobs.ab.integrity``); one
    ``error:`` line and exit 2 when Redis cannot be reached or read, or holds no such stream."""
    import redis  # lazy: keeps `recsys --help` fast
    from redis.exceptions import ConnectionError as RedisConnectionError  # lazy: as redis
    from redis.exceptions import RedisError  # lazy: as redis
    from redis.exceptions import TimeoutError as RedisTimeoutError  # lazy: as redis

    from jobs.ab.events import events_frame, read_stream, stream_name  # lazy: keeps `recsys --help` fast
    from jobs.ab.integrity import integrity_warning, stream_integrity  # lazy: as above
    from recsys.event_ledger import read_acknowledged  # lazy: as above

    shown = _redacted(url)
    try:
        acknowledged = read_acknowledged(ledger, namespace) if ledger is not None else None
    except ValueError as exc:
        return c.fail(str(exc))
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=REDIS_CONNECT_TIMEOUT_S)
    except ValueError as exc:
        return c.fail(f"--redis-url {shown}: {exc}")
    try:
        log = read_stream(client, namespace)
        return log, stream_integrity(client, namespace, log, acknowledged)
    except (RedisConnectionError, RedisTimeoutError) as exc:
        return c.fail(f"cannot reach Redis at {shown}: {exc}")
    except RedisError as exc:  # e.g. the key holds something other than a stream
        return c.fail(f"Redis at {shown}: cannot read {stream_name(namespace)}: {exc}")
    except ValueError as exc:  # no such stream (a wrong --namespace, or a Redis that lost it): not an empty log
        gone = stream_integrity(client, namespace, events_frame([]), acknowledged)
        if gone["accepted"]:
            return c.fail(f"Redis at {shown}: no events to analyze: {integrity_warning(namespace, gone, analysis=False)}")
        return c.fail(f"Redis at {shown}: {exc}")
    finally:
        client.close()


@ab_app.command("replay-dir")
def replay_dir(
    to: Annotated[Path, typer.Option("--to", help="Serving directory to create (symlinks + hidden test split).",
                                     callback=c.not_dash)],
    data: c.DataOpt = None, config: c.ConfigOpt = None, artifacts: c.ArtifactsOpt = None,
) -> None:
    """Build the directory to serve for `ab simulate`: trained stages, test items not yet known."""
    from jobs.ab.simulate import replay_artifacts  # lazy: keeps `recsys --help` fast

    art = c.artifact_dir(c.load_settings(config), data, artifacts)
    _split_of(art)
    typer.echo(str(replay_artifacts(art, to)))


@ab_app.command("simulate")
def simulate(
    url: Annotated[str, typer.Option(help="Base URL of a loopback server started on `ab replay-dir`'s output.")],
    data: c.DataOpt = None, config: c.ConfigOpt = None, artifacts: c.ArtifactsOpt = None,
    users: Annotated[int, typer.Option(min=1, help="Most test users replayed.")] = 500,
    seconds: Annotated[float, typer.Option(min=0.1, help="Most wall time.")] = 60.0,
    k: Annotated[int, typer.Option(min=1, help="Items per request.")] = 10,
    seed: Annotated[int, typer.Option(help="Order of the users.")] = 0,
    out: c.OutOpt = None,
) -> None:
    """Replay held-out users: recommend, click the true next item when shown, log through /v1/events."""
    import httpx  # lazy: keeps `recsys --help` fast

    from jobs.ab.simulate import replay_source  # lazy: keeps `recsys --help` fast
    from jobs.ab.simulate import simulate as run  # lazy: as above

    art = c.artifact_dir(c.load_settings(config), data, artifacts)
    if (original := replay_source(art)) is not None:  # its test items are hidden: nothing could be clicked
        c.fail(f"{art} is a replay directory (`recsys ab replay-dir` made it from {original}): serve it, and give "
               f"the original as --artifacts ({original}), whose test items are the targets")
    try:
        report = run(url, _split_of(art), users=users, seconds=seconds, k=k, seed=seed)
    except ValueError as exc:
        c.fail(str(exc))
    except httpx.TransportError as exc:  # nothing listening, a timeout, a dropped connection
        c.fail(f"cannot reach the server at {url}: {type(exc).__name__}: {exc}")
    for warning in report["warnings"]:
        typer.secho(f"warning: {warning}", fg=typer.colors.YELLOW, err=True)
    _write_report(report, out)
