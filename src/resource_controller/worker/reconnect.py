"""When to register again: the reconnection tracker.

A controller that lost track of this worker (it was silent for longer than the
controller's horizon, or the controller itself restarted: a new
``Rc-Controller-Instance``) may have marked its devices unknown or quarantined. A fresh
registration, with a fresh recovery proof, is how the worker says "I am here, and this
is what I can prove". But registration reaps whatever the controller thinks is in
flight, so it is only ever attempted while the worker supervises nothing; deciding that
is the agent's part. This module only keeps the debt and its appointment.

Every non-streaming request that got any HTTP response is *contact* and is fed here
with its response time (monotonic, from the injected clock) and the instance header.
Arming sets an appointment a random moment ahead (so a restarted controller is not hit
by its whole fleet at once); a second reason never moves it. An attempt first pushes
the appointment a retry interval ahead, so a failure is retried no sooner than that.

The three thresholds are ``Timings.reregister_after`` (5 minutes: it mirrors the
controller's horizon after which a silent worker's devices are quarantined),
``reregister_jitter`` (30 s) and ``reregister_retry`` (1 minute).
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
        #: Time of the latest response; only ever moves forward (responses finish out
        #: of order). ``None`` until the first contact.
        self.last_at: float | None = None
        #: Latest non-empty ``Rc-Controller-Instance``; an empty header never
        #: overwrites it and is never a change.
        self.instance = ""
        #: When the owed re-registration is due; ``None`` when nothing is owed.
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
            self._arm(at, reason)

    def arm(self, now: float, reason: str) -> None:
        """Owe a re-registration for a reason of the worker's own (EXT-MIG: the devices
        nvidia-smi lists changed under ``devices: auto``); the same appointment rules."""
        self._arm(now, reason)

    def _arm(self, now: float, reason: str) -> None:
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
        """Whether a re-registration is owed and its appointment has come."""
        return self.due_at is not None and now >= self.due_at

    def attempting(self, now: float) -> None:
        """An attempt starts: a failure is retried no sooner than the retry interval."""
        self.due_at = now + self.timings.reregister_retry

    def settled(self) -> None:
        """A registration succeeded: nothing is owed any more."""
        self.due_at = None
