"""Options and helpers every ``recsys`` subcommand shares.

Each command that reads a dataset takes ``--data DIR`` (format detected from the files,
``--format`` to force one; no ``--data`` means the synthetic default), and each command
that measures writes its JSON report to ``--out FILE``. Heavy imports stay inside commands, and
so do the jobs, serving and settings modules (pandas, Redis, every stage's config): ``recsys
--help`` imports no torch, transformers, faiss, lightgbm, scipy, pandas or redis (the light stage
modules the commands name, yaml and tqdm only).

Errors: ``fail`` prints one ``error: ...`` line and exits 2. ``UserErrorGroup`` (the root
command group) does the same for the exceptions bad input raises anywhere below a command
(``USER_INPUT_ERRORS``: a ``ValueError`` such as a refused request or config, a missing or
unreadable file, a number out of range), so no command answers bad input with a traceback;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
import typer
from typer._click.exceptions import (  # typer (pinned) vendors click: the classes it raises
    ClickException,
    NoArgsIsHelpError,
    UsageError,
)
from typer._click.globals import get_current_context  # the vendored click's, as for the exceptions above
from typer.core import TyperGroup

from recsys.atomic import json_default
from recsys.cluster import ClusterError, parse_address, ray_session
from recsys.pipeline import PipelineError
from recsys.provenance import write_result

if TYPE_CHECKING:
    from cascade.settings import Settings

DataOpt = Annotated[
    Path | None,
    typer.Option("--data", help="Dataset directory (MovieLens 100K/1M/latest or generic CSV/Parquet). "
                 "Omit for the synthetic default.", exists=True, file_okay=False, dir_okay=True),
]
FormatOpt = Annotated[
    str | None, typer.Option("--format", help="Force the format: ml-100k, ml-1m, ml-csv, generic.")
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="Pipeline YAML (default configs/pipeline.yaml).")
]
def not_dash(path: Path | None) -> Path | None:
    """A folder option's value, ``-`` refused: it reads as standard output, not as a folder to create."""
    if path is not None and str(path) == "-":
        raise typer.BadParameter("'-' is not a folder here (it reads as standard output): give a folder name")
    return path


ArtifactsOpt = Annotated[
    Path | None,
    typer.Option("--artifacts", help="This dataset's artifact directory (default <artifacts_dir>/<dataset name>).",
                 callback=not_dash),
]
def writable_path(out: Path | None) -> Path | None:
    """An output file checked before the command works (a long eval must not end in a refused
    write): a file name whose nearest existing path above it is a writable directory, with no
    broken symlink on the way. A typer option callback (one parameter: the value)."""
    return _writable(out, folder=False)


def writable_folder(out: Path | None) -> Path | None:
    """``writable_path`` for an output directory (``--report-dir``)."""
    return _writable(out, folder=True)


def _writable(out: Path | None, folder: bool) -> Path | None:
    if out is None:
        return None
    if str(out) == "-":  # not a path: a user asking for standard output, where the report goes anyway
        raise typer.BadParameter("'-' is not a path here: give a file or folder name (the JSON report is "
                                 "printed to standard output anyway)")
    if out.is_dir() and not folder:
        raise typer.BadParameter(f"{out} is a directory; give a file name")
    chain = (out.absolute(), *out.absolute().parents) if folder else (out.absolute().parent, *out.absolute().parents)
    above = next(p for p in chain if os.path.lexists(p))
    if not above.exists():
        raise typer.BadParameter(f"{out}: {above} is a broken symbolic link")
    if not above.is_dir():
        raise typer.BadParameter(f"{out}: {above} is a file, not a directory")
    if not os.access(above, os.W_OK | os.X_OK):
        raise typer.BadParameter(f"{out}: {above} is not writable")
    return out


OutOpt = Annotated[Path | None, typer.Option("--out", help="Write the JSON report here.", dir_okay=False,
                                             callback=writable_path)]
KCoreOpt = Annotated[int | None, typer.Option(
    "--k-core", min=1, show_default=False,
    help="Iterative k-core filter (default: the prepared split's, else 5).")]
CatalogOpt = Annotated[Literal["interacted", "listed"] | None, typer.Option(
    "--catalog", show_default=False,
    help="Which items are served and ranked: interacted (those the k-core keeps, as published protocols rank) "
    "or listed (also every item the items file lists with no event yet, a new item placed by its content) "
    "(default: the prepared split's, else interacted).")]
SynthUsersOpt = Annotated[int | None, typer.Option(
    "--synthetic-users", min=10, show_default=False,
    help="Synthetic default: users (default: the prepared split's, else 600).")]
SynthItemsOpt = Annotated[int | None, typer.Option(
    "--synthetic-items", min=20, show_default=False,
    help="Synthetic default: items (default: the prepared split's, else 1200).")]


RayOpt = Annotated[str | None, typer.Option(
    "--ray", metavar="ADDRESS", show_default=False,
    help="Run the heavy jobs on a Ray cluster: auto (the cluster this machine joined), local or local:N (a Ray "
    "instance of N CPUs started for this command), ray://host:port or host:port (default: $RECSYS_RAY__ADDRESS, "
    "else in this process; docs/cluster.md).")]


def load_settings(config: Path | None, ray: str | None = None) -> Settings:
    """The settings of ``config`` (env on top), with ``--ray ADDRESS`` over both; exit 2 naming a bad key."""
    from cascade.settings import ConfigError, Settings  # lazy: keeps `recsys --help` fast

    if ray is not None:
        try:
            parse_address(ray)
        except ClusterError as exc:
            fail(f"--ray: {exc}")
    try:
        return Settings.from_yaml(config, **({"ray": {"address": ray}} if ray is not None else {}))
    except ConfigError as exc:  # one line: the file, then each bad key after "; "
        return fail("; ".join(line.strip() for line in str(exc).splitlines()))


def on_cluster(settings: Settings) -> None:
    """Connect to the Ray cluster ``settings.ray`` names until the running command ends
    (``recsys.cluster.ray_session``, closed with the command's context); nothing when it names none."""
    if settings.ray.address is not None:
        get_current_context().with_resource(ray_session(settings.ray))


def artifact_dir(settings: Settings, data: Path | None, explicit: Path | None) -> Path:
    from jobs.prepare import dataset_name  # lazy: keeps `recsys --help` fast (jobs import pandas)

    return explicit if explicit is not None else Path(settings.artifacts_dir) / dataset_name(data)


def trained(config: Path | None, data: Path | None, artifacts: Path | None) -> tuple[Settings, Path]:
    """(settings, artifact dir) for a command that needs trained artifacts; exits 2 naming the dir if absent."""
    from jobs.prepare import recorded_source, same_dataset  # lazy: keeps `recsys --help` fast

    settings = load_settings(config)
    art = artifact_dir(settings, data, artifacts)
    if not (art / "split").exists():
        fail(f"{art}: no trained artifacts here; run `recsys train --data ...` first")
    recorded = recorded_source(art)
    if data is not None and recorded and not same_dataset(recorded, data):
        fail(f"{art} holds the cascade of dataset {recorded.get('data')!r}, whose files differ from those of "
             f"--data {data}; give one of --data and --artifacts, or both for the same dataset")
    return settings, art


def servable(settings: Settings, art: Path) -> None:
    """Exit 2 naming the stages trained on another split than ``art/split`` (see
    ``cascade.registry.check_trained_on_split``), or the first trained file whose digest differs from
    training's (``cascade.registry.check_artifact_digests``); builds the stages without loading them."""
    from cascade.registry import (  # lazy: imports the stage modules
        build_pipeline,
        check_artifact_digests,
        check_trained_on_split,
    )

    pipeline = build_pipeline(settings, art, load=False)
    check_trained_on_split(pipeline, art)  # StaleArtifacts: exit 2
    check_artifact_digests(pipeline, art)  # ArtifactIntegrityError (a ValueError): exit 2


def strict_json(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, +-inf) replaced by None and numpy scalars/arrays
    made plain Python, so that ``json.dumps(..., allow_nan=False)`` accepts it.

    >>> strict_json({"a": float("nan"), "b": [1.5, np.float64("inf")], "c": np.int64(3)})
    {'a': None, 'b': [1.5, None], 'c': 3}
    """
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    if isinstance(value, np.ndarray):
        return strict_json(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_report(report: dict[str, Any], out: Path | None, *, settings: Settings | None = None,
                 data: Path | None = None, seeds: Sequence[int] | None = None, show: bool = True) -> None:
    """Print the report (unless ``show`` is False) and, with ``--out``, write it atomically (tmp file + rename) with its
    ``provenance`` block (``recsys.provenance``: command, commit, digests of ``settings`` and of the
    ``data`` directory, machine, ``seeds``, date); strict JSON: an undefined number (NaN, +-inf) is
    written as null, never as the non-JSON ``NaN``."""
    report = strict_json(report)
    text = json.dumps(report, indent=2, default=json_default, allow_nan=False)
    if out is not None:
        config = None if settings is None else settings.model_dump(mode="json")  # secrets come masked
        if seeds is None and settings is not None:
            seeds = [settings.seed]
        write_result(out, report, config=config, data=data, seeds=seeds)
        typer.echo(f"report written to {out}", err=True)
    if show:
        typer.echo(text)


def fail(message: str, code: int = 2) -> Any:
    _say(message)
    raise typer.Exit(code)


def _say(message: str) -> None:
    """The error on one line (an exception's text may span several; the contract is one line)."""
    typer.secho(f"error: {' '.join(message.split())}", fg=typer.colors.RED, err=True)


# what bad input raises: LimitError/ValidationError/ConfigError/DataError are ValueErrors
USER_INPUT_ERRORS = (ValueError, OverflowError, FileNotFoundError, FileExistsError, NotADirectoryError,
                     IsADirectoryError, PermissionError)


class UserErrorGroup(TyperGroup):
    """The ``recsys`` root group: a ``USER_INPUT_ERRORS`` exception from any command is one line + exit 2,
    and so is a usage error click finds (an unknown option, a value outside its type or choices)."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("standalone_mode", True) is False:  # a caller (CliRunner, a test) handles errors itself
            return super().main(*args, **kwargs)
        try:
            code = super().main(*args, **{**kwargs, "standalone_mode": False})
        except NoArgsIsHelpError as exc:  # a group called bare: its help, as click prints it
            exc.show()
            raise SystemExit(exc.exit_code) from None
        except UsageError as exc:  # BadParameter, NoSuchOption, MissingParameter, ...
            where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
            _exit_with(exc.format_message() + where, 2)
        except typer.Abort:
            _exit_with("aborted", 1)
        except ClickException as exc:
            _exit_with(exc.format_message(), exc.exit_code)
        raise SystemExit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except USER_INPUT_ERRORS as exc:
            return fail(one_line(exc))
        except PipelineError as exc:  # a required stage could not answer (HTTP says 503): not a bug
            return fail(one_line(exc), code=1)


def _exit_with(message: str, code: int) -> None:
    """``fail`` outside a running command (no click context left to turn ``typer.Exit`` into an exit)."""
    _say(message)
    raise SystemExit(code)


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line.

    >>> one_line(ValueError("invalid request:\\n  user_id: too short"))
    'ValueError: invalid request: user_id: too short'
    """
    return " ".join(f"{type(exc).__name__}: {exc}".split())


