"""Store-suite fixtures: a second, plain connection to the store's database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from resource_controller.store.facade import Store

from .dbview import Raw


@pytest.fixture
def raw(store: Store, database: Path | str) -> Iterator[Raw]:
    """Reads and arranges rows of the database the ``store`` fixture opened."""
    r = Raw(database)
    try:
        yield r
    finally:
        r.close()
