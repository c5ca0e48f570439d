"""Test hooks read from the environment, for end-to-end tests only.

End-to-end tests run the worker as a real process, where a module attribute cannot be
patched, yet they must simulate a reboot and cannot wait five minutes for a
re-registration. Two variables let them, and nothing else reads them:

- ``RC_TEST_BOOT_ID_PATH``: the file read as the kernel's boot ID instead of
  ``/proc/sys/kernel/random/boot_id`` (WRK-135); writing a new value there and
  restarting the worker looks like a reboot to the controller.
- ``RC_TEST_TIMINGS``: comma-separated ``name=seconds`` pairs overriding the worker's
  *(test hook)* constants (names in ``TIMINGS``). An unknown name, a name given twice
  or a value that is not a finite number of seconds ≥ 0 fails start-up.

These are not configuration (WRK-022 still holds for operators) and are deliberately
absent from user documentation. Empty or unset variables change nothing. They are read
by ``rc worker`` only (``agent.run_worker``): inside ``rc up`` the controller shares the
process and its own reading of ``RC_TEST_TIMINGS`` owns the variable.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping

BOOT_ID_VAR = "RC_TEST_BOOT_ID_PATH"
TIMINGS_VAR = "RC_TEST_TIMINGS"

_W = "resource_controller.worker."

#: Name accepted in ``RC_TEST_TIMINGS`` → (module, attribute) it overrides.
TIMINGS: dict[str, tuple[str, str]] = {
    "reregister_after": (_W + "reconnect", "REREGISTER_AFTER"),
    "reregister_jitter": (_W + "reconnect", "REREGISTER_JITTER"),
    "reregister_retry": (_W + "reconnect", "REREGISTER_RETRY"),
    "outbox_backoff": (_W + "outbox", "BACKOFF"),
    "outbox_backoff_max": (_W + "outbox", "BACKOFF_MAX"),
    "report_attempt_timeout": (_W + "outbox", "ATTEMPT_TIMEOUT"),
    "poll_error_backoff": (_W + "agent", "POLL_ERROR_BACKOFF"),
    "idle_poll_gap": (_W + "agent", "IDLE_POLL_GAP"),
    "shutdown_wait": (_W + "agent", "SHUTDOWN_WAIT"),
    "kill_grace": (_W + "runner", "KILL_GRACE"),
    "sweep_term": (_W + "sweep", "TERM_PHASE"),
    "sweep_kill": (_W + "sweep", "KILL_PHASE"),
}


class TestHookError(Exception):
    """A test-hook variable is malformed; the message names it."""

    __test__ = False  # not a pytest test class, whatever its name says


def parse_timings(text: str) -> dict[str, float]:
    """``"a=1,b=0.5"`` → ``{"a": 1.0, "b": 0.5}``; raises ``TestHookError``."""
    out: dict[str, float] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq:
            raise TestHookError(f"{TIMINGS_VAR}: {item!r} is not name=seconds")
        if name not in TIMINGS:
            known = ", ".join(sorted(TIMINGS))
            raise TestHookError(f"{TIMINGS_VAR}: unknown timing {name!r} (known: {known})")
        if name in out:
            raise TestHookError(f"{TIMINGS_VAR}: {name} given twice")
        try:
            seconds = float(value.strip())
        except ValueError:
            seconds = math.nan
        if not math.isfinite(seconds) or seconds < 0:
            raise TestHookError(f"{TIMINGS_VAR}: {name}={value.strip()!r} is not seconds >= 0")
        out[name] = seconds
    return out


def apply(environ: Mapping[str, str]) -> None:
    """Apply both variables from ``environ``; nothing happens when they are unset."""
    timings = parse_timings(environ.get(TIMINGS_VAR, ""))
    boot_path = environ.get(BOOT_ID_VAR, "")
    for name, seconds in timings.items():
        module, attribute = TIMINGS[name]
        setattr(importlib.import_module(module), attribute, seconds)
    if boot_path:
        from resource_controller.worker import procs

        procs.BOOT_ID_PATH = boot_path
        procs.forget_boot_id()
