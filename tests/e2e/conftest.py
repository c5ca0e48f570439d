"""Fixtures for the end-to-end suite: a fresh cluster per test, stopped by PID."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .cluster import Cluster, free_port, stop

#: The two ways to run a controller and a worker: every interactive feature is tested on
#: both, so that neither can break on its own again.
SETUPS = ("serve+worker", "up")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp=tmp_path, port=free_port())
    try:
        yield c
    finally:
        for proc in reversed(c.procs):
            stop(proc)


@pytest.fixture(params=SETUPS)
def box(request: pytest.FixtureRequest, cluster: Cluster) -> Cluster:
    """One device, ``box.dev``: ``rc serve`` plus ``rc worker``, or ``rc up``."""
    if request.param == "up":
        cluster.start_up()
    else:
        cluster.start_controller()
        cluster.start_worker("box", ["gpu0"])
    return cluster
