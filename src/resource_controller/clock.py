"""Injected time, so tests advance it instead of sleeping (STORE-004/005)."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Source of the current instant."""

    def now(self) -> float:
        """Unix seconds, UTC, with sub-second precision."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards; only differences mean anything."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that moves only when told to; both readings advance together."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._mono = 1000.0

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        """Move time forward (or back, for skew tests) by ``seconds``."""
        self._now += seconds
        if seconds > 0:
            self._mono += seconds

    def set(self, instant: float) -> None:
        """Jump the wall clock to ``instant`` (the monotonic clock follows only forward)."""
        self.advance(instant - self._now)
