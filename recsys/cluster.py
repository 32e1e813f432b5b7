"""The cluster setting: where the heavy jobs run, and the one way of connecting to Ray.

``ClusterConfig`` is the ``ray`` section of the settings (``cascade.settings.Settings``; env
``RECSYS_RAY__ADDRESS``, CLI ``--ray ADDRESS``). ``address`` is one of:

- ``None`` (the default): no cluster. Every job runs in this process, as on one machine; Ray is
  never imported.
- ``"local"`` or ``"local:N"``: a Ray instance started inside this process with N CPUs (default
  ``num_workers * cpus_per_worker``) and stopped when the job ends; what tests and a single
  machine use to run the cluster code path.
- ``"auto"``: the cluster this machine belongs to (``ray start --head`` / ``ray start --address``).
- ``"ray://host:port"`` (Ray Client) or ``"host:port"`` (a head node's GCS address).

``ray_session(cfg)`` connects as the setting asks and disconnects on exit; inside a session already
open (an outer job's, a test's ``ray.init``) it reuses that one and leaves it open. The workers
import this repository from the path the driver runs it from (``PYTHONPATH`` in the job's
``runtime_env``), so a multi-node cluster needs the repository, and the artifacts directory, at the
same path on every node (docs/cluster.md).

Deliberately left out: autoscaling settings, Ray Client authentication, GPU scheduling.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCAL = "local"
_HOST_PORT = re.compile(r"^[\w.\-]+:\d{1,5}$")
_LOCAL_CPUS = re.compile(r"^local(:[1-9][0-9]{0,3})?$")
ADDRESS_FORMS = "'auto', 'local', 'local:N', 'ray://host:port' or 'host:port'"


def valid_address(value: str) -> bool:
    """Whether ``value`` is one of ``ADDRESS_FORMS`` (``local`` and ``auto`` are no host names).

    >>> [valid_address(a) for a in ("auto", "local:2", "ray://head:10001", "head:6379", "local:0", "head")]
    [True, True, True, True, False, False]
    """
    if value == "auto" or _LOCAL_CPUS.match(value):
        return True
    hostport = value.removeprefix("ray://")
    return bool(_HOST_PORT.match(hostport)) and hostport.split(":")[0] not in ("auto", LOCAL)


class ClusterError(ValueError):
    """The cluster setting is malformed or names no reachable cluster (bad input: exit 2 on the CLI)."""


class ClusterConfig(BaseModel):
    """Where the heavy jobs (training, evaluation, tagging) run; ``address: None`` keeps them in-process."""

    model_config = ConfigDict(extra="forbid")

    address: str | None = Field(None, description=f"Ray cluster to run on: {ADDRESS_FORMS}; None runs every job "
                                "in this process without Ray.")
    num_workers: int = Field(2, ge=1, le=4096, description="Training workers (processes) a distributed fit uses; "
                             "1 keeps the two-tower fit in this process even with a cluster.")
    cpus_per_worker: int = Field(1, ge=1, le=1024, description="CPUs each training worker reserves (and its torch "
                                 "threads).")

    @field_validator("address", mode="before")
    @classmethod
    def _known_form(cls, value: object) -> object:
        if isinstance(value, str):
            value = value.strip() or None
        if isinstance(value, str) and not valid_address(value):
            raise ValueError(f"ray address {value!r} is none of {ADDRESS_FORMS}")
        return value

    @property
    def enabled(self) -> bool:
        """A cluster is configured (``address`` set)."""
        return self.address is not None

    @property
    def distributed(self) -> bool:
        """Training is spread over workers: a cluster and more than one worker."""
        return self.enabled and self.num_workers > 1

    def local_cpus(self) -> int | None:
        """CPUs of the in-process instance ``local[:N]`` starts; None for an existing cluster.

        >>> ClusterConfig(address="local:3").local_cpus(), ClusterConfig(address="local").local_cpus()
        (3, 2)
        >>> ClusterConfig(address="auto").local_cpus() is None
        True
        """
        if self.address is None or not self.address.startswith(LOCAL):
            return None
        _, _, n = self.address.partition(":")
        return int(n) if n else self.num_workers * self.cpus_per_worker


def parse_address(value: str) -> ClusterConfig:
    """A ``ClusterConfig`` for ``value`` alone (what ``--ray`` gives), or ``ClusterError`` naming the forms.

    >>> parse_address("local:2").address
    'local:2'
    >>> parse_address("nowhere")
    Traceback (most recent call last):
    ...
    recsys.cluster.ClusterError: ray address 'nowhere' is none of 'auto', 'local', 'local:N', 'ray://host:port' or 'host:port'
    """
    if not valid_address(value.strip()):
        raise ClusterError(f"ray address {value!r} is none of {ADDRESS_FORMS}")
    return ClusterConfig(address=value)


def connected() -> bool:
    """Whether this process has a Ray session open (``ray_session`` around the job); never imports Ray."""
    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())


@contextmanager
def ray_session(cfg: ClusterConfig) -> Iterator[bool]:
    """Connect to Ray as ``cfg`` asks for the block; yields whether Ray is in use.

    No address: yields False and never imports Ray. Ray already initialised (an outer session):
    reused and left open. Otherwise ``ray.init`` (a local instance for ``local[:N]``, else the
    cluster at ``address``) and ``ray.shutdown`` on exit. A cluster that cannot be reached is a
    ``ClusterError`` naming the address."""
    if cfg.address is None:
        yield False
        return
    import ray  # lazy: heavy optional dependency, imported only when a cluster is configured

    if ray.is_initialized():
        yield True
        return
    env = {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH"))
                                                      if p)}}
    cpus = cfg.local_cpus()
    if cpus is None and cfg.address != "auto":
        _check_reachable(cfg.address)
    try:
        if cpus is not None:
            ray.init(num_cpus=cpus, include_dashboard=False, runtime_env=env, log_to_driver=False)
        else:
            ray.init(address=cfg.address, runtime_env=env, log_to_driver=False)
    except (ConnectionError, RuntimeError, TimeoutError) as exc:
        raise ClusterError(f"no Ray cluster at {cfg.address!r} ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); "
                           "start one with `ray start --head` or use --ray local") from None
    try:
        yield True
    finally:
        ray.shutdown()


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A ``ClusterError`` unless something listens at ``address``'s host and port: ``ray.init`` would retry
    an unreachable head node for minutes before saying so."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ClusterError(f"no Ray cluster at {address!r} ({exc.strerror or exc}); start one with "
                           "`ray start --head` or use --ray local") from None
