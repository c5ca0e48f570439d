"""A fair share between people, as pure rules: how many devices each
submitter may hold at once, which names are at their limit, and whether a job's end
lets the jobs waiting for it go on. The scheduling pass (``planner.Planner``) applies
the limits; the store settles the dependencies (``store/after.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from resource_controller.core.states import JobState

#: The top of a submitter limit: more devices than any fleet has, as a number every
#: database and the wire carry (EXT-LIMITS-1's range).
LIMIT_MAX = 2**31 - 1


@dataclass(frozen=True)
class SubmitterLimits:
    """How many devices each submitter may hold at once: per name, and a
    default for every other name (``"*"`` in the limits file, or
    ``--max-devices-per-submitter``); ``None`` = no limit."""

    default: int | None = None
    names: Mapping[str, int] = field(default_factory=dict)

    @property
    def on(self) -> bool:
        return self.default is not None or bool(self.names)

    def of(self, name: str) -> int | None:
        """The limit that applies to ``name``; None when none does."""
        return self.names.get(name, self.default)


NO_LIMITS = SubmitterLimits()


def over_limit(
    limits: SubmitterLimits, held: Mapping[str, int], share: str, count: int
) -> int | None:
    """The limit that keeps a job of ``count`` devices under ``share`` from being placed now,
    ``held`` being every device ``share`` holds (leases of jobs and holds, a gang's each);
    None when it may be."""
    limit = limits.of(share)
    if limit is None or held.get(share, 0) + max(1, count) <= limit:
        return None
    return limit


def at_limit(limits: SubmitterLimits, held: Mapping[str, int]) -> list[str]:
    """The names no job of whose can be placed now, however small: each holds its limit
    or more. A pass can leave their jobs unread; what it places only ever
    adds to what a name holds. The default's names are not listed: only held ones."""
    names = set(held) | set(limits.names)
    out = []
    for name in names:
        limit = limits.of(name)
        if limit is not None and held.get(name, 0) >= limit:
            out.append(name)
    return sorted(out)


def dependency_met(ended: str, after_any: bool) -> bool:
    """A job a waiting job named has ended in state ``ended``: whether that lets the
    waiting job go on. ``after_any``: any end will do; otherwise only
    ``succeeded``, and any other end fails the waiting job (``dependency_failed``)."""
    return after_any or ended == JobState.SUCCEEDED
