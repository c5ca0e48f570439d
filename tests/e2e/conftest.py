"""Fixtures for the end-to-end suite: a fresh cluster per test, stopped by PID."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .cluster import Cluster, free_port, stop


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp=tmp_path, port=free_port())
    try:
        yield c
    finally:
        for proc in reversed(c.procs):
            stop(proc)
