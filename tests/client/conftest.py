"""Fixtures for client tests: clean settings, a live controller, a fake worker."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from client.live import FakeWorker, LiveController
from resource_controller.client import config


@pytest.fixture(autouse=True)
def clean_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No test sees the developer's config file or a previous test's cached settings."""
    for name in ("RC_CONTROLLER", "RC_TOKEN", "RC_SUBMITTER", "CLAUDE_SESSION_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RC_CONFIG", os.devnull)  # an empty file: no settings
    config.reset()
    yield
    config.reset()


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[LiveController]:
    live = LiveController(tmp_path / "data")
    try:
        yield live
    finally:
        live.stop()


@pytest.fixture
def worker(controller: LiveController) -> Iterator[FakeWorker]:
    fake = FakeWorker(controller)
    try:
        yield fake
    finally:
        fake.stop()
