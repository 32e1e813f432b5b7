"""`recsys ab analyze` on a stream that lost events: a warning with the counts, never a silent short log."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import redis
from typer.testing import CliRunner

from cli.main import app
from recsys.event_ledger import advance
from recsys.redis_client import RedisGuard
from recsys.redis_server import EmbeddedRedis
from serving.catalog_state import SplitHistories
from serving.online_state import OnlineState


def _experiment_traffic(state: OnlineState, users: int) -> None:
    """Per user: one impression and one click in their arm (half control, half treatment)."""
    for n in range(users):
        arm = "control" if n % 2 else "treatment"
        common = {"user_id": f"u{n}", "item_id": "i1", "experiment": "exp", "variant": arm}
        state.log_impressions([{**common, "type": "impression"}])
        state.ingest(f"click-{n}", f"u{n}", None, None, {**common, "type": "click"})


def _analyze(url: str, out: Path, *extra: str):  # noqa: ANN202 - typer's Result
    return CliRunner().invoke(app, ["ab", "analyze", "--redis-url", url, "--namespace", "shop", "--out", str(out),
                                    "--expected", "control=0.5,treatment=0.5", *extra])


def test_analyze_warns_with_the_counts_when_redis_came_back_without_events(tmp_path: Path) -> None:
    """After a Redis crash 1,600 of 1,920 events were gone and the report said `"warnings": []`."""
    server = EmbeddedRedis(tmp_path / "sock")  # nothing on disk
    try:
        url = server.start()
        state = OnlineState(redis.Redis.from_url(url), RedisGuard(min_s=0.01, max_s=0.02), "shop",
                            SplitHistories([]), history_max_len=10, stream_maxlen=10_000, dedup_ttl_s=600)
        _experiment_traffic(state, 40)  # 80 entries
        server.stop()
        server.start()
        state.client.connection_pool.disconnect()
        gone = _analyze(url, tmp_path / "gone.json")  # nothing left to analyze: said with the counts
        assert gone.exit_code == 2 and not (tmp_path / "gone.json").exists()
        assert gone.stderr.strip() == (  # the server has not written since: only its ledger would know
            f"error: Redis at {url}: shop:events does not exist: no events under namespace 'shop', and no *:events "
            "stream at all here")
        assert state.reconcile() == 80  # what the server does when its supervisor has restarted Redis
        told = _analyze(url, tmp_path / "gone.json")
        assert told.exit_code == 2 and told.stderr.strip().startswith(
            f"error: Redis at {url}: no events to analyze: shop:events holds 0 of the 80 events serving accepted; "
            "80 are missing: 80 lost when Redis came back without them (#1-#80;")
        _experiment_traffic(state, 10)
        res = _analyze(url, tmp_path / "an.json")
        assert res.exit_code == 0, res.output
        report = json.loads((tmp_path / "an.json").read_text())
        stream = report["event_stream"]
        assert (stream["accepted"], stream["held"], stream["lost"], stream["missing"]) == (100, 20, 80, 80)
        assert report["warnings"][0].startswith(
            "shop:events holds 20 of the 100 events serving accepted; 80 are missing: 80 lost when Redis came back "
            "without them (#1-#80;")
        assert f"warning: {report['warnings'][0]}" in " ".join(res.stderr.split())
    finally:
        server.close()


def test_analyze_with_the_ledger_counts_events_no_server_has_recorded_as_lost(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "sock")
    try:
        url = server.start()
        state = OnlineState(redis.Redis.from_url(url), RedisGuard(), "shop", SplitHistories([np.zeros(0)]),
                            history_max_len=10, stream_maxlen=10_000, dedup_ttl_s=600)
        _experiment_traffic(state, 10)  # 20 entries, all held
        ledger = tmp_path / "events-ledger.json"
        advance(ledger, "shop", 50)  # serving had acknowledged 50 before this Redis was restored from an old file
        res = _analyze(url, tmp_path / "an.json", "--ledger", str(ledger))
        assert res.exit_code == 0, res.output
        stream = json.loads((tmp_path / "an.json").read_text())["event_stream"]
        assert (stream["accepted"], stream["held"], stream["not_in_redis"], stream["ledger"]) == (50, 20, 30, 50)
        assert "30 acknowledged by serving (its ledger reaches #50)" in " ".join(res.stderr.split())
        assert _analyze(url, tmp_path / "whole.json").exit_code == 0  # without the ledger: nothing known missing
        assert json.loads((tmp_path / "whole.json").read_text())["event_stream"]["missing"] == 0
    finally:
        server.close()


def test_a_lost_stream_is_reported_even_when_what_is_left_cannot_be_analysed(tmp_path: Path) -> None:
    """The loss went unsaid exactly when a reset left too little to analyse: only the analysis error was printed."""
    server = EmbeddedRedis(tmp_path / "sock")
    try:
        url = server.start()
        state = OnlineState(redis.Redis.from_url(url), RedisGuard(min_s=0.01, max_s=0.02), "shop",
                            SplitHistories([]), history_max_len=10, stream_maxlen=10_000, dedup_ttl_s=600)
        _experiment_traffic(state, 40)
        server.stop()
        server.start()
        state.client.connection_pool.disconnect()
        assert state.reconcile() == 80
        for n in range(5):  # clicks with no impression: nothing an arm can be measured on
            state.ingest(f"late-{n}", f"u{n}", None, None,
                         {"user_id": f"u{n}", "item_id": "i1", "experiment": "exp", "variant": "control",
                          "type": "click"})
        res = _analyze(url, tmp_path / "an.json")
        lines = [" ".join(ln.split()) for ln in res.stderr.split("\nerror")]
        assert res.exit_code == 2, res.output
        assert lines[0].startswith("warning: shop:events holds 5 of the 85 events serving accepted; 80 are missing")
        assert "error" in res.stderr
    finally:
        server.close()
