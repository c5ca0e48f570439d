"""When to register again: the reconnection tracker.

A controller that lost track of this worker (silence past its horizon, or a new
``Rc-Controller-Instance``) may have quarantined its devices; a fresh registration says
"I am here". This keeps only the debt and its appointment, a random moment ahead so a
restarted controller is not hit by its whole fleet at once.
"""

from __future__ import annotations

import logging
import random

from resource_controller.core import durations
from resource_controller.worker.timings import DEFAULT, Timings

log = logging.getLogger(__name__)


class Reconnect:
    """Contact history and the re-registration debt."""

    def __init__(self, rng: random.Random | None = None, timings: Timings = DEFAULT) -> None:
        self._rng = rng or random.Random()
        self.timings = timings
        #: The latest response (never moves back) and non-empty instance header.
        self.last_at: float | None = None
        self.instance = ""
        self.due_at: float | None = None

    @property
    def owed(self) -> bool:
        return self.due_at is not None

    def observe(self, at: float, instance: str) -> None:
        """Record one contact at ``at``; arm when it proves we were forgotten."""
        reason = ""
        if self.last_at is not None and at - self.last_at >= self.timings.reregister_after:
            reason = f"no contact for {durations.render_duration(at - self.last_at)}"
        if instance:
            if self.instance and instance != self.instance and not reason:
                reason = f"controller instance changed from {self.instance} to {instance}"
            self.instance = instance
        if self.last_at is None or at > self.last_at:
            self.last_at = at
        if reason:
            self.arm(at, reason)

    def arm(self, now: float, reason: str) -> None:
        """Owe a re-registration, due a random moment ahead, unless already owed."""
        if self.due_at is not None:
            return  # a second reason never moves the appointment
        delay = self._rng.random() * self.timings.reregister_jitter
        self.due_at = now + delay
        log.info(
            "re-registration owed (%s); due in %s",
            reason,
            durations.render_duration(delay),
            extra={"action": "reregister_owed"},
        )

    def due(self, now: float) -> bool:
        return self.due_at is not None and now >= self.due_at

    def attempting(self, now: float) -> None:
        """An attempt starts: a failure is retried no sooner than the retry interval."""
        self.due_at = now + self.timings.reregister_retry

    def settled(self) -> None:
        """A registration succeeded: nothing is owed any more."""
        self.due_at = None
