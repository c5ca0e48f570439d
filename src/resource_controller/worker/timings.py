"""The worker's clocks: every wait, bound and back-off a test may shorten, in one object.

``Timings()`` carries the shipped values (§23); the agent hands its one instance to
everything that waits. Tests build their own (``Timings(kill_grace=0.5)``); the spec's
*(test hook)* values are these fields, and ``from_text`` reads ``RC_TEST_TIMINGS``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from resource_controller.core import testtimings


@dataclass(frozen=True)
class Timings:
    """Seconds, every one of them; the defaults are the shipped values."""

    # ---- the poll loop and shutdown ----
    #: Wait after a failed poll.
    poll_error_backoff: float = 2.0
    #: Minimum gap after a poll that started nothing and came back early.
    idle_poll_gap: float = 0.25
    #: Bound on one non-streaming request to a controller, a long poll's excepted: a
    #: frozen controller (its connections open, nothing answering) is left after it.
    request_timeout: float = 5.0
    #: A long poll is bounded by the wait it asks for plus this.
    poll_margin: float = 2.0
    #: How long shutdown waits for job tasks before abandoning them.
    shutdown_wait: float = 45.0
    #: After abandoning, how long to wait for the cancelled tasks to kill their groups.
    abandon_wait: float = 5.0

    # ---- supervision ----
    #: SIGTERM → SIGKILL grace on the cancellation path.
    kill_grace: float = 10.0
    #: How often the watchdogs are checked.
    watchdog_period: float = 0.1

    # ---- output ----
    #: A batch of output is sent this long after its first byte.
    log_flush_after: float = 1.0
    #: After a terminal job ends, how long its last output gets to reach the relay
    #: before the PTY master is closed.
    pty_drain: float = 2.0

    # ---- ending a job's stragglers by RC_JOB_ID ----
    #: Length of the SIGTERM phase, then of the SIGKILL phase.
    straggler_term: float = 2.0
    straggler_kill: float = 2.0
    #: How often each phase re-scans ``/proc``.
    straggler_poll: float = 0.02

    # ---- reports through the outbox ----
    #: First wait after a failed attempt; doubles up to ``outbox_backoff_max``.
    outbox_backoff: float = 0.2
    outbox_backoff_max: float = 10.0
    #: Bound on one attempt of a report (and on the ``running`` report).
    report_attempt_timeout: float = 5.0

    # ---- lease lifecycle hooks ----
    #: How often an armed release linger looks at the clock (the linger itself is
    #: configured per device; this only bounds how late it fires on a fake clock).
    linger_check: float = 0.25
    #: The shutdown drain of armed releases, for all devices together.
    release_drain_budget: float = 20.0
    #: The start-up release pass, for all devices together.
    startup_release_budget: float = 120.0

    # ---- re-registration ----
    #: Silence after which the next contact arms a re-registration.
    reregister_after: float = 300.0
    #: Arming picks the appointment uniformly in ``[0, reregister_jitter)`` ahead.
    reregister_jitter: float = 30.0
    #: An attempt moves the appointment this far ahead first.
    reregister_retry: float = 60.0

    # ---- capability probes ----
    #: Bound on one whole probe pass; probes not reached in it are skipped.
    probe_pass_budget: float = 30.0

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_text(cls, text: str) -> Timings:
        """The shipped values with ``RC_TEST_TIMINGS`` text applied
        (``"kill_grace=1,straggler_term=0.5"``); ``testtimings.TestTimingsError``."""
        return cls(**testtimings.parse(text, cls.names()))


#: The shipped values, for callers that were given none.
DEFAULT = Timings()
