"""CLI fixtures: the client suite's live controller and fake worker, and an ``rc`` runner."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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


@dataclass(frozen=True)
class Finished:
    """What a background ``rc`` left: the fields of click's ``Result`` that tests read."""

    exit_code: int
    stdout: str
    stderr: str


def rc_in_background(*args: str, env: dict[str, str]) -> Callable[[float], Finished]:
    """Start ``rc`` as a process of its own; the returned function waits for it.

    A process, not a thread: ``CliRunner`` swaps ``sys.stdout`` and ``sys.stderr`` for
    the whole interpreter, so a second in-process ``rc`` started meanwhile would capture
    what the first one prints.
    """
    rc = str(Path(sys.executable).parent / "rc")
    proc = subprocess.Popen(
        [rc, *args],
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def result(timeout: float) -> Finished:
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
        return Finished(proc.returncode, out, err)

    return result
