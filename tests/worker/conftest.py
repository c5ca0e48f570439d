"""Worker test fixtures.

After each test, kill anything still carrying a test job ID. Every test gets its own
state directory (the outbox lives there), so no test writes to ``/var/lib/rc-worker``,
and short back-offs, so a retried report or poll costs milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import worker_helpers
from worker_helpers import kill_test_processes

from resource_controller.worker import agent, outbox


@pytest.fixture(autouse=True)
def _janitor() -> Iterator[None]:
    yield
    kill_test_processes()


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path) -> Iterator[None]:
    worker_helpers.STATE_DIR = str(tmp_path / "worker-state")
    yield
    worker_helpers.STATE_DIR = ""


@pytest.fixture(autouse=True)
def _fast_timings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outbox, "BACKOFF", 0.01)
    monkeypatch.setattr(outbox, "BACKOFF_MAX", 0.05)
    monkeypatch.setattr(agent, "POLL_ERROR_BACKOFF", 0.05)
    monkeypatch.setattr(agent, "IDLE_POLL_GAP", 0.05)
