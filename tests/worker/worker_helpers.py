"""Helpers shared by the worker tests: bounded asyncio runs, job IDs, a process finder.

Every job a test starts carries an ``RC_JOB_ID`` from ``new_job_id()``, so the
janitor in ``conftest.py`` can find and SIGKILL whatever a failing test left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import uuid
from collections.abc import Coroutine
from typing import Any, TypeVar

from resource_controller.worker.timings import Timings

T = TypeVar("T")

#: What worker tests run with unless they say otherwise: short back-offs, so a retried
#: report or poll costs milliseconds.
FAST = Timings(
    outbox_backoff=0.01, outbox_backoff_max=0.05, poll_error_backoff=0.05, idle_poll_gap=0.05
)

SESSION_PREFIX = f"wt{uuid.uuid4().hex[:10]}"
_counter = itertools.count(1)

#: The current test's worker state directory (set by ``conftest._state_dir``).
STATE_DIR = ""


def new_job_id() -> str:
    """A job ID unique to this test session, recognisable by the janitor."""
    return f"{SESSION_PREFIX}-{next(_counter)}"


def run(coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
    """Run a coroutine on a fresh loop, never for longer than ``timeout`` seconds."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def pids_with_job_prefix(prefix: str) -> list[int]:
    """Live processes whose environment has ``RC_JOB_ID`` starting with ``prefix``."""
    found = []
    needle = f"RC_JOB_ID={prefix}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(item.startswith(needle) for item in env.split(b"\0")):
            found.append(int(entry))
    return found


def kill_test_processes(prefix: str = SESSION_PREFIX) -> None:
    for pid in pids_with_job_prefix(prefix):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
