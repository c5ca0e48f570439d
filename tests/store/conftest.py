"""Store-suite fixtures: a second, plain connection to the store's database file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from resource_controller.store.facade import Store

from .dbview import Raw


@pytest.fixture
def raw(store: Store, tmp_path: Path) -> Iterator[Raw]:
    """Reads and arranges rows of the file the ``store`` fixture opened."""
    r = Raw(tmp_path / "rc.db")
    try:
        yield r
    finally:
        r.close()
