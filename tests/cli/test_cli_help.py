"""Every ``recsys`` command's ``--help`` shows each option's help text whole.

typer renders help through rich, whose markup takes ``[word: ...]`` for a style tag and drops
it: "Iterative k-core filter [default: the prepared split's, else 5]." printed as "Iterative
k-core filter .".
"""

import re

import pytest
import typer
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()


def _commands(command, path: tuple[str, ...] = ()):
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():  # typer vendors its own click
        yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(typer.main.get_command(app)))


def _flat(text: str) -> str:
    return re.sub(r"[\s│╭╮╰╯─]+", "", text)  # rich wraps and boxes the text


@pytest.mark.parametrize("path,command", COMMANDS, ids=[" ".join(p) or "recsys" for p, _ in COMMANDS])
def test_every_option_help_is_shown_whole(path, command):
    res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    shown = _flat(res.output)
    lost = [p.name for p in command.params if getattr(p, "help", None) and _flat(p.help).rstrip(".") not in shown]
    assert not lost, f"help text cut in `recsys {' '.join(path)} --help`: {lost}"
