"""Worker test fixtures: after each test, kill anything still carrying a test job ID."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from worker_helpers import kill_test_processes


@pytest.fixture(autouse=True)
def _janitor() -> Iterator[None]:
    yield
    kill_test_processes()
