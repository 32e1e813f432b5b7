"""The cluster setting (recsys.cluster): its forms, where it is read from (settings file, environment,
``--ray``), refusals as one line with exit status 2, and the Ray session it opens only when asked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cascade.settings import ConfigError, Settings
from cli.main import app
from recsys.cluster import ClusterConfig, ClusterError, parse_address, ray_session
from serving.server_process import free_port
from tests.heavy import HEAVY

runner = CliRunner()


@pytest.mark.parametrize("address", ["auto", "local", "local:4", "ray://head.example:10001", "10.0.0.5:6379"])
def test_every_documented_form_is_accepted(address: str):
    assert parse_address(address).address == address
    assert ClusterConfig(address=address).enabled


@pytest.mark.parametrize("address", ["nowhere", "local:0", "local:x", "ray://head", "http://head:8265", "auto:3"])
def test_other_forms_are_refused_naming_the_accepted_ones(address: str):
    with pytest.raises(ClusterError, match="is none of 'auto', 'local', 'local:N'"):
        parse_address(address)
    with pytest.raises(ValueError, match="ray address"):
        ClusterConfig(address=address)


def test_no_address_is_no_cluster_and_one_worker_is_not_distributed():
    assert not ClusterConfig().enabled and not ClusterConfig().distributed
    assert ClusterConfig(address="").address is None  # an empty variable means unset
    assert not ClusterConfig(address="auto", num_workers=1).distributed
    assert ClusterConfig(address="auto").distributed
    assert ClusterConfig(address="local", num_workers=3, cpus_per_worker=2).local_cpus() == 6


def test_the_environment_sets_the_address_and_a_bad_one_names_the_variable(monkeypatch):
    assert Settings.build().ray.address is None
    monkeypatch.setenv("RECSYS_RAY__ADDRESS", "auto")
    monkeypatch.setenv("RECSYS_RAY__NUM_WORKERS", "4")
    assert (Settings.build().ray.address, Settings.build().ray.num_workers) == ("auto", 4)
    monkeypatch.setenv("RECSYS_RAY__ADDRESS", "nowhere")
    with pytest.raises(ConfigError, match=r"ray\.address.*RECSYS_RAY__ADDRESS"):
        Settings.build()


def test_the_settings_file_sets_it(tmp_path: Path):
    cfg = tmp_path / "p.yaml"
    cfg.write_text("ray:\n  address: local:2\n  cpus_per_worker: 1\n")
    assert Settings.from_yaml(cfg).ray.local_cpus() == 2


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_bad_ray_flag_is_one_line_and_exit_2_before_any_work(tmp_path: Path, command: str):
    res = runner.invoke(app, [command, "--ray", "nowhere", "--artifacts", str(tmp_path / "a")])
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        "error: --ray: ray address 'nowhere' is none of 'auto', 'local', 'local:N', 'ray://host:port' or 'host:port'"]
    assert not (tmp_path / "a").exists()


def test_no_cluster_at_the_address_is_one_line_and_exit_2(tmp_path: Path):
    # nothing listens there: refused at once (not after Ray's minutes of retries), before any data is prepared
    address = f"127.0.0.1:{free_port()}"
    res = subprocess.run([sys.executable, "-m", "cli.main", "train", "recall", "--ray", address, "--artifacts",
                          str(tmp_path / "a")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: ClusterError: no Ray cluster at '{address}'"), res.stderr
    assert not (tmp_path / "a").exists()


def test_no_address_never_imports_ray():
    code = ("import sys; from recsys.cluster import ClusterConfig, ray_session\n"
            "with ray_session(ClusterConfig()) as on: assert on is False\n"
            "assert 'ray' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.slow
def test_a_session_already_open_is_reused_and_left_open():
    import ray

    with ray_session(ClusterConfig(address="local:1")):
        assert ray.is_initialized()
        with ray_session(ClusterConfig(address="auto")) as on:  # inside: no second connection
            assert on
        assert ray.is_initialized()
    assert not ray.is_initialized()


@pytest.mark.slow
@HEAVY
def test_the_ray_flag_trains_the_two_tower_on_two_workers(tmp_path: Path, monkeypatch):
    # the product's entry point end to end: a tiny synthetic set, a two-epoch fit, a local 2-CPU instance
    for key, value in {"RECSYS_RAY__NUM_WORKERS": "2", "RECSYS_RECALL__MAX_EPOCHS": "2", "RECSYS_RECALL__DIM": "16",
                       "RECSYS_RECALL__USE_TEXT": "false", "RECSYS_RECALL__COVISIT_CHANNEL": "false",
                       "RECSYS_RECALL__ITEM_MODEL": "off"}.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "report.json"
    res = runner.invoke(app, ["train", "recall", "--ray", "local:2", "--synthetic-users", "40", "--synthetic-items",
                              "60", "--artifacts", str(tmp_path / "a"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    recall = json.loads(out.read_text())["recall"]
    assert (recall["workers"]["num_workers"], recall["workers"]["backend"]) == (2, "gloo")
    assert recall["epochs"] == 2 and (tmp_path / "a" / "recall" / "model.pt").is_file()
