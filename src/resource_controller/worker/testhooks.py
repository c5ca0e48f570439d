"""Test hooks read from the environment, for end-to-end tests only.

End-to-end tests run the worker as a real process, where nothing can be injected, yet
they must simulate a reboot and cannot wait five minutes for a re-registration. Two
variables let them, and nothing else reads them:

- ``RC_TEST_BOOT_ID_PATH``: the file read as the kernel's boot ID instead of
  ``/proc/sys/kernel/random/boot_id``; writing a new value there and
  restarting the worker looks like a reboot to the controller.
- ``RC_TEST_TIMINGS``: comma-separated ``name=seconds`` pairs overriding fields of the
  worker's ``Timings``, parsed by ``Timings.from_text`` (an unknown name, a name given
  twice or a value that is not a finite number of seconds ≥ 0 fails start-up).

These are not configuration (WRK-022 still holds for operators) and are deliberately
absent from user documentation. Empty or unset variables change nothing. They are read
by ``rc worker`` only (``process.run_worker``): inside ``rc up`` the controller shares
the process and its own reading of ``RC_TEST_TIMINGS`` owns the variable.
"""

from __future__ import annotations

from collections.abc import Mapping

from resource_controller.worker import procs
from resource_controller.worker.timings import TIMINGS_VAR, Timings, TimingsError

BOOT_ID_VAR = "RC_TEST_BOOT_ID_PATH"

__all__ = ["BOOT_ID_VAR", "TIMINGS_VAR", "TestHookError", "apply"]


class TestHookError(Exception):
    """A test-hook variable is malformed; the message names it."""

    __test__ = False  # not a pytest test class, whatever its name says


def apply(environ: Mapping[str, str]) -> Timings:
    """The timings ``environ`` asks for, after pointing the boot ID at its file.

    Raises ``TestHookError``; with both variables unset, returns the shipped timings
    and changes nothing.
    """
    try:
        timings = Timings.from_text(environ.get(TIMINGS_VAR, ""))
    except TimingsError as exc:
        raise TestHookError(str(exc)) from exc
    boot_path = environ.get(BOOT_ID_VAR, "")
    if boot_path:
        procs.BOOT_ID_PATH = boot_path
        procs.forget_boot_id()
    return timings
