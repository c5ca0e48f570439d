"""The worker's clocks: every wait, bound and back-off a test may shorten, in one object.

``Timings()`` carries the spec's values (worker.md §23). The
agent receives one and hands it to everything that waits: the job's lifecycle, the
runner, the straggler pass, the outbox, the reconnection tracker, the log shipper.
Tests build their own (``Timings(kill_grace=0.5)``) instead of patching modules; the
values marked *(test hook)* in the spec are exactly these fields.

End-to-end tests run ``rc worker`` as a real process and cannot pass an object, so
``from_text`` reads ``RC_TEST_TIMINGS`` (``name=seconds`` pairs, the names being the
field names), by the grammar ``core.testtimings`` gives both processes. An unknown
name, a name given twice or a value that is not a finite number of seconds ≥ 0 is an
error naming itself.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from resource_controller.core import testtimings

TIMINGS_VAR = testtimings.VARIABLE


class TimingsError(Exception):
    """``RC_TEST_TIMINGS`` is malformed; the message names the variable and the entry."""


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
    def from_text(cls, text: str, base: Timings | None = None) -> Timings:
        """``base`` (the defaults) with the ``RC_TEST_TIMINGS`` text applied.

        ``"kill_grace=1,straggler_term=0.5"``; blank text changes nothing. Raises
        ``TimingsError``.
        """
        try:
            changes = testtimings.parse(text, cls.names())
        except testtimings.TestTimingsError as exc:
            raise TimingsError(str(exc)) from None
        return dataclasses.replace(base or cls(), **changes)


#: The shipped values, for callers that were given none.
DEFAULT = Timings()
