"""Accounting rules, pure: ``--since``, a group's figures, the table a window becomes."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import astuple, dataclass

#: The ways a window can be grouped (``rc usage --by``); ``submitter`` by default.
BY = ("submitter", "device", "host")
DEFAULT_BY = "submitter"
DEFAULT_SINCE = "7d"
#: A usage window starts on a whole hour: the rollup's grain.
HOUR = 3600
#: The longest window: about a century, so no number a client sends overflows.
MAX_SINCE = 36_500 * 86_400
#: Groups an answer lists at most; the rest are counted in ``more`` (EXT-LIMITS-4).
MAX_GROUPS = 1000

_SINCE_UNITS = {"w": 7 * 86_400, "d": 86_400, "h": 3_600, "m": 60, "s": 1}
_SINCE_TERM = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([wdhms])")


class UsageError(ValueError):
    """A usage question that cannot be answered as asked; the message names the part."""


def parse_since(text: str) -> int:
    """``--since`` text as whole seconds (``7d``, ``36h``, ``1d12h``): the duration grammar
    with days and weeks, positive, at most ``MAX_SINCE``."""
    s = text.strip()
    pos, total = 0, 0.0
    while 0 < len(s) <= 64 and pos < len(s):
        m = _SINCE_TERM.match(s, pos)
        if m is None:
            break
        total += float(m.group(1)) * _SINCE_UNITS[m.group(2)]
        pos = m.end()
    if not s or pos != len(s):
        raise UsageError(
            f"since: {text[:64]!r} is not a duration (examples: 7d, 36h, 2w, 1d12h, 90m)"
        )
    if not math.isfinite(total) or total < 1:
        raise UsageError(f"since: {text!r} must be at least one second")
    if total > MAX_SINCE:
        raise UsageError(f"since: {text!r} is longer than {MAX_SINCE // 86_400}d")
    return int(total)


def check_by(by: str) -> str:
    """``by`` if it is a grouping the rollup keeps, else ``UsageError`` naming the choices."""
    if by not in BY:
        raise UsageError(f"by: {by[:64]!r} is not one of {', '.join(BY)}")
    return by


def window_start(now: int, since: int) -> int:
    """The first hour in the window, as an hour number (Unix seconds // 3600): the hour
    that holds ``now - since``. The window runs from its start to ``now``."""
    return max(0, now - since) // HOUR


@dataclass(frozen=True)
class Figures:
    """A group's sums: jobs, device-seconds held, and of those the seconds with a known
    GPU utilisation and the same weighted by it (``held × util / 100``)."""

    jobs: int = 0
    held_seconds: int = 0
    sampled_seconds: int = 0
    weighted_seconds: float = 0.0

    def __sub__(self, other: Figures) -> Figures:
        return Figures(*(a - b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def __add__(self, other: Figures) -> Figures:
        return Figures(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))


@dataclass(frozen=True)
class Group:
    key: str
    figures: Figures


@dataclass(frozen=True)
class Window:
    """The answer to one usage question: groups by device-hours, largest first."""

    by: str
    #: Unix seconds: the window's first instant (a whole hour) and its end (now).
    start: int
    end: int
    groups: list[Group]
    #: Every group of the window summed, those left out of ``groups`` included.
    total: Figures
    #: Groups beyond ``MAX_GROUPS`` (or the asked limit), left out of ``groups``.
    more: int = 0


def summarise(
    by: str, start: int, end: int, deltas: Iterable[Group], limit: int = MAX_GROUPS
) -> Window:
    """The groups with jobs in the window, largest first, at most ``limit``; a total of all."""
    found = [g for g in deltas if g.figures.jobs > 0 or g.figures.held_seconds > 0]
    found.sort(key=lambda g: (-g.figures.held_seconds, g.key))
    total = Figures()
    for g in found:
        total += g.figures
    kept = found[: max(0, limit)]
    return Window(by, start, end, kept, total, len(found) - len(kept))


def hours(seconds: float) -> float:
    """Seconds as hours, to the nearest thousandth (3.6 s): what the answer shows."""
    return round(seconds / HOUR, 3)


def gpu_hours(f: Figures) -> float | None:
    """Utilisation-weighted GPU-hours; ``None`` when no held second had a known utilisation."""
    return hours(f.weighted_seconds) if f.sampled_seconds > 0 else None


def share(f: Figures, total: Figures) -> float | None:
    """The group's part of the window's device-hours (0..1, four places); ``None``: none held."""
    if total.held_seconds <= 0:
        return None
    return round(f.held_seconds / total.held_seconds, 4)
