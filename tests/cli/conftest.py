"""CLI fixtures: the client suite's live controller and fake worker, and an ``rc`` runner."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from click.testing import CliRunner, Result

from client.conftest import clean_settings, controller, worker  # noqa: F401  (fixtures)
from resource_controller.cli.group import rc as rc_group
from resource_controller.client import config

Rc = Callable[..., Result]


@pytest.fixture
def run_rc() -> Rc:
    """Invoke ``rc`` in-process; keyword ``env`` adds environment variables."""

    def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
        config.reset()  # each invocation is a fresh process as far as settings go
        return CliRunner().invoke(rc_group, list(args), env=env, catch_exceptions=False)

    return invoke
