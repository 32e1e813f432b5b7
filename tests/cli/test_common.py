"""cli.common: what every command shares."""

import pytest
import typer

from cli import common


def test_fail_prints_a_multi_line_message_on_one_line_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as exit_info:
        common.fail("cannot read data.csv:\n  line 3: bad value\n\tcolumn user_id")
    assert exit_info.value.exit_code == 2
    err = capsys.readouterr().err
    assert err == "error: cannot read data.csv: line 3: bad value column user_id\n"
