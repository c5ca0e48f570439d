"""In-process wake-ups: long polls and log followers sleep until something changed.

A wake-up is a hint that makes things fast; correctness never depends on one,
because every sleeper also re-checks on a bounded timeout. Each key has an
``asyncio.Event`` that is set and replaced on every wake, so a sleeper that took
the event before checking the store can never miss a wake that lands in between.

Only ``controller/wake.py``'s ``apply`` calls the wake methods, after the change that
implies them has committed; operations say what to wake as data (``wake.Wake``).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

from resource_controller.controller.events import Broadcaster
from resource_controller.controller.relay import Relay
from resource_controller.controller.webhooks import Notifier


class Signals:
    """Per-key level-triggered wake-ups (a set event is replaced by a fresh one)."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = defaultdict(asyncio.Event)

    def waiter(self, key: str) -> asyncio.Event:
        """The event the next ``wake(key)`` sets; take it BEFORE checking the condition."""
        return self._events[key]

    def wake(self, key: str) -> None:
        ev = self._events.pop(key, None)
        if ev is not None:
            ev.set()


class Hub:
    """Wake-ups for worker long polls, log followers and the scheduler loop, and the two
    outward channels: the event stream (EVT-*) and the webhook notifier (HOOKN-*)."""

    def __init__(self) -> None:
        self.workers = Signals()
        self.logs = Signals()
        self.schedule = asyncio.Event()
        self.shutting_down = asyncio.Event()
        self.events = Broadcaster(time.time)
        #: None unless a webhook URL is configured (HOOKN-001).
        self.notifier: Notifier | None = None
        #: The interactive relay's sessions, in memory only (TTY-002).
        self.relay = Relay()

    def kick_scheduler(self) -> None:
        """Ask for a scheduling pass soon (EXT-FAST-1); kicks close together coalesce."""
        self.schedule.set()

    def job_changed(self, job_id: str) -> None:
        """A job's state changed: followers of its log re-check it (EXT-FAST-2)."""
        self.logs.wake(job_id)
