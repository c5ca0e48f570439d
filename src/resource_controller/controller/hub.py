"""In-process wake-ups, hints only: every sleeper also re-checks on a timeout."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

from resource_controller.controller.events import Broadcaster
from resource_controller.controller.parked import ParkedPolls
from resource_controller.controller.relay import Relay
from resource_controller.controller.webhooks import Notifier

if TYPE_CHECKING:
    from resource_controller.controller.wake import Wake


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

    def wake_all(self) -> None:
        events, self._events = self._events, defaultdict(asyncio.Event)
        for ev in events.values():
            ev.set()


class Hub:
    """Wake-ups for worker long polls, log followers and the scheduler loop, and the two
    outward channels: the event stream (EVT-*) and the webhook notifier (HOOKN-*)."""

    def __init__(self) -> None:
        self.workers = Signals()
        #: Worker polls waiting for work, which a report's commit may answer directly.
        self.parked = ParkedPolls()
        self.logs = Signals()
        self.schedule = asyncio.Event()
        self.shutting_down = asyncio.Event()
        self.events = Broadcaster(time.time)
        #: None unless a webhook URL is configured.
        self.notifier: Notifier | None = None
        #: The interactive relay's sessions, in memory only.
        self.relay = Relay()
        #: Where wake-ups go for the other controllers on the database; None when there are none.
        self.forward: Callable[[Wake], None] | None = None

    def kick_scheduler(self) -> None:
        """Ask for a scheduling pass soon; kicks close together coalesce."""
        self.schedule.set()

    def wake_everyone(self) -> None:
        """Every long poll and log follower re-checks (a wake-up too big to name them)."""
        self.workers.wake_all()
        self.logs.wake_all()
        self.events.jobs_nudge()
        self.events.devices_nudge()

    def job_changed(self, job_id: str) -> None:
        """A job's state changed: followers of its log re-check it."""
        self.logs.wake(job_id)
