"""The worker's clocks: every wait, bound and back-off a test may shorten, in one object;
``Timings()`` carries the shipped values (§23), ``from_text`` reads ``RC_TEST_TIMINGS``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from resource_controller.core import testtimings


@dataclass(frozen=True)
class Timings:
    """Seconds, every one of them; the defaults are the shipped values."""

    #: After a failed poll; after one that started nothing and came back early.
    poll_error_backoff: float = 2.0
    idle_poll_gap: float = 0.25
    #: One non-streaming request (a frozen controller is left after it); a long poll
    #: gets its wait plus ``poll_margin``.
    request_timeout: float = 5.0
    poll_margin: float = 2.0
    #: Shutdown's wait for job tasks, then for the abandoned ones to kill their groups.
    shutdown_wait: float = 45.0
    abandon_wait: float = 5.0
    #: SIGTERM → SIGKILL on the cancellation path; how often watchdogs are checked.
    kill_grace: float = 10.0
    watchdog_period: float = 0.1
    #: A batch of output is sent this long after its first byte.
    log_flush_after: float = 1.0
    #: A terminal job's last output, to reach the relay before the PTY closes.
    pty_drain: float = 2.0
    #: The stragglers' SIGTERM and SIGKILL phases, and how often they re-scan.
    straggler_term: float = 2.0
    straggler_kill: float = 2.0
    straggler_poll: float = 0.02
    #: A report's first wait after a failed attempt, doubling up to the max; one attempt.
    outbox_backoff: float = 0.2
    outbox_backoff_max: float = 10.0
    report_attempt_timeout: float = 5.0
    #: How often a linger looks at the clock; the release drain and start-up pass.
    linger_check: float = 0.25
    release_drain_budget: float = 20.0
    startup_release_budget: float = 120.0
    #: Silence that arms a re-registration; its jitter; its retry interval.
    reregister_after: float = 300.0
    reregister_jitter: float = 30.0
    reregister_retry: float = 60.0
    #: One whole probe pass; probes not reached in it are skipped.
    probe_pass_budget: float = 30.0

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_text(cls, text: str) -> Timings:
        """The shipped values with ``"kill_grace=1,straggler_term=0.5"`` applied."""
        return cls(**testtimings.parse(text, cls.names()))


DEFAULT = Timings()
