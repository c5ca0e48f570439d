"""CLI fixtures: the client suite's live controller and fake worker, and an ``rc`` runner."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
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


class BackgroundRc:
    """``rc`` started as a process of its own, its stderr read line by line as it comes.

    A process, not a thread: ``CliRunner`` swaps ``sys.stdout`` and ``sys.stderr`` for
    the whole interpreter, so a second in-process ``rc`` started meanwhile would capture
    what the first one prints. Reading stderr as it comes lets a test wait for what
    ``rc`` has said (``said``) instead of sleeping for it.
    """

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        rc = str(Path(sys.executable).parent / "rc")
        self.proc = subprocess.Popen(
            [rc, *args],
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._lines: list[str] = []
        self._out: list[str] = []
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read_stderr, daemon=True),
            threading.Thread(target=self._read_stdout, daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._changed:
                self._lines.append(line)
                self._changed.notify_all()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        self._out.append(self.proc.stdout.read())

    def said(self, text: str, times: int = 1, timeout: float = 15) -> None:
        """Wait until ``times`` lines of stderr contain ``text``."""

        def enough() -> bool:
            return sum(text in line for line in self._lines) >= times

        with self._changed:
            assert self._changed.wait_for(enough, timeout), (text, self._lines)

    def result(self, timeout: float) -> Finished:
        """Wait for ``rc`` to exit (killed past ``timeout``) and return what it left."""
        try:
            self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)
        for reader in self._readers:
            reader.join(5)
        return Finished(self.proc.returncode, "".join(self._out), "".join(self._lines))


Spawn = Callable[..., BackgroundRc]


@pytest.fixture
def spawn_rc() -> Iterator[Spawn]:
    """Start ``rc`` in the background (``BackgroundRc``); any left running are killed."""
    started: list[BackgroundRc] = []

    def spawn(*args: str, env: dict[str, str]) -> BackgroundRc:
        started.append(BackgroundRc(*args, env=env))
        return started[-1]

    yield spawn
    for background in started:
        if background.proc.poll() is None:
            background.proc.kill()
            background.proc.wait(5)
