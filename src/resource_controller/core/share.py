"""A fair share between people, as pure rules: submitter limits and dependency ends."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from resource_controller.core.states import JobState

#: The top of a submitter limit: more than any fleet, within every database (EXT-LIMITS-1).
LIMIT_MAX = 2**31 - 1


@dataclass(frozen=True)
class SubmitterLimits:
    """How many devices each submitter may hold at once: per name, and a default (``"*"`` or
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
    """The limit keeping a job of ``count`` devices under ``share`` waiting; None when it may go."""
    limit = limits.of(share)
    if limit is None or held.get(share, 0) + max(1, count) <= limit:
        return None
    return limit


def at_limit(limits: SubmitterLimits, held: Mapping[str, int]) -> list[str]:
    """The held names at or over their limit: a pass can leave their jobs unread."""
    names = set(held) | set(limits.names)
    out = []
    for name in names:
        limit = limits.of(name)
        if limit is not None and held.get(name, 0) >= limit:
            out.append(name)
    return sorted(out)


def dependency_met(ended: str, after_any: bool) -> bool:
    """Whether ``ended`` lets the waiting job go on: any end with ``after_any``, else success."""
    return after_any or ended == JobState.SUCCEEDED
