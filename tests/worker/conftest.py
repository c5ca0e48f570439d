"""Worker test fixtures.

After each test, kill anything still carrying a test job ID. Every test gets its own
state directory (the outbox lives there), so no test writes to ``/var/lib/rc-worker``.
Short back-offs come from ``worker_helpers.FAST``, the timings agents get in tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import worker_helpers
from worker_helpers import kill_test_processes


@pytest.fixture(autouse=True)
def _janitor() -> Iterator[None]:
    yield
    kill_test_processes()


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path) -> Iterator[None]:
    worker_helpers.STATE_DIR = str(tmp_path / "worker-state")
    yield
    worker_helpers.STATE_DIR = ""
