"""`recsys serve` on artifacts whose Redis state another server holds: one error line, exit 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cascade.registry import STAGE_KINDS
from cli.main import app
from recsys import redis_server
from recsys.redis_server import EmbeddedRedis
from tests.serving.toy import TOY_KINDS, save_toy_split


def test_a_second_server_on_the_same_artifacts_is_one_error_line(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Two embedded Redis writing one append-only file would corrupt it: the second server refuses to start."""
    art = tmp_path / "toy"
    save_toy_split(art)
    for kind, path in TOY_KINDS.items():
        monkeypatch.setitem(STAGE_KINDS, kind, path)
    monkeypatch.setattr(redis_server, "LOCK_WAIT_S", 0.2)
    monkeypatch.delenv("REDIS_URL", raising=False)
    cfg = tmp_path / "toy.yaml"
    cfg.write_text("pipeline:\n  stages:\n    - {name: recall, kind: recall, on_error: fail}\n")
    first = EmbeddedRedis(tmp_path / "sock", data_dir=art / "state" / "redis")  # what the first server holds
    try:
        first.start()
        res = CliRunner().invoke(app, ["serve", "--config", str(cfg), "--artifacts", str(art), "--port", "1"])
    finally:
        first.close()
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    [line] = [ln for ln in res.output.splitlines() if ln.strip()]
    assert line == (f"error: {art.resolve() / 'state' / 'redis'} is in use by another embedded Redis (server pid "
                    f"{os.getpid()}): stop the other `recsys serve` on these artifacts, or give this one "
                    "serving.redis_state_dir or a redis_url")
