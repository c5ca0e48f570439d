"""Fixtures for the controller suite; the harness itself is in ``controller_harness.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from controller_harness import START, Harness, open_controller

from resource_controller.clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def rc(tmp_path: Path, clock: FakeClock, database: Path | str) -> Iterator[Harness]:
    """A live controller on loopback with worker/client/admin/anonymous clients, on the
    suite's backend (``--backend``)."""
    url = database if isinstance(database, str) else ""
    h = Harness(open_controller(tmp_path / "data", clock, database=url), clock, tmp_path / "data")
    try:
        yield h
    finally:
        h.close()
