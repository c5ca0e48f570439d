"""``RC_TEST_CRASH_AT``: die at a named point of a write path (a test hook only).

With ``RC_TEST_CRASH_AT=name[:n]`` the ``n``-th time a write path reaches ``name`` the
process ends as ``kill -9`` would there; the test restarts it on the same data.
"""

from __future__ import annotations

import os

VARIABLE = "RC_TEST_CRASH_AT"
#: The exit status of a process that died at a crash point.
CRASH_STATUS = 86

#: The store operations whose transactions carry a crash point, by point name.
TRANSACTIONS = (
    "submit",  # enqueue a job
    "grant",  # one assignment of the scheduling pass: device busy, job assigned, lease
    "handout",  # a worker's poll takes its assigned jobs
    "running",  # a worker's running report
    "finish",  # a terminal status report: job ends, lease ends, device ready
    "kill",  # a kill request
    "register",  # a worker's registration
    "heartbeat",  # a worker's heartbeat
    "sweep",  # the reaper's sweep
)
#: Every point ``RC_TEST_CRASH_AT`` may name.
POINTS = frozenset(
    [f"{name}.{phase}" for name in TRANSACTIONS for phase in ("before_commit", "after_commit")]
    + ["log_append.before_write", "log_append.after_write"]
)

_armed: str | None = None
_left = 0


class CrashPointError(ValueError):
    """The variable is malformed; the message names it and what is wrong."""


def parse(text: str | None) -> tuple[str, int] | None:
    """``(point, n)`` from ``name[:n]``; ``None`` for blank text."""
    if text is None or not text.strip():
        return None
    name, sep, count = text.strip().partition(":")
    if name not in POINTS:
        known = ", ".join(sorted(POINTS))
        raise CrashPointError(f"{VARIABLE}: unknown crash point {name!r} (known: {known})")
    if not sep:
        return name, 1
    if not count.isdigit() or int(count) < 1:
        raise CrashPointError(
            f"{VARIABLE}: {text.strip()!r}: the count after ':' must be a whole number >= 1"
        )
    return name, int(count)


def arm(text: str | None) -> None:
    """Arm the point ``text`` names (or disarm, for blank text); raises ``CrashPointError``."""
    global _armed, _left
    parsed = parse(text)
    _armed, _left = (None, 0) if parsed is None else parsed


def hit(point: str, phase: str = "") -> None:
    """The write path reached ``point + phase``; die if that is the armed point's turn."""
    if _armed is None or point + phase != _armed:
        return
    global _left
    _left -= 1
    if _left <= 0:
        os.write(2, f"rc: {VARIABLE}: crashing at {_armed}\n".encode())
        os._exit(CRASH_STATUS)
