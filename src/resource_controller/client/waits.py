"""The client's polling waits and output follows as rules without I/O.

``api.JsonClient`` polls with blocking calls and ``aio.AsyncClient`` with awaited ones;
both loops only carry out what a wait here decides: how long the next poll may take,
whether the caller's bound has passed, when consecutive failures give up, whether the
job is where it was awaited, and how long to pause. Following a job's output is the
same: where to reopen a broken stream, and when breaks in a row give up. So the two
clients cannot drift apart on a bound, a limit or a message.
"""

from __future__ import annotations

from resource_controller import errors
from resource_controller.client.messages import PolledJob
from resource_controller.core.states import TERMINAL, JobState

#: Pause between polls in both wait loops.
POLL_INTERVAL = 0.5
#: Per-poll timeout and the failure count that gives up, wait-until-scheduled.
SCHEDULED_POLL_TIMEOUT = 1.0
SCHEDULED_GIVE_UP = 17
#: The same for wait-until-terminal.
TERMINAL_POLL_TIMEOUT = 10.0
TERMINAL_GIVE_UP = 6
#: Consecutive reconnects of a broken log stream that deliver nothing
#: before ``rc run`` gives up on the output (about 8 s, as wait-until-scheduled).
STREAM_GIVE_UP = 17


class PollGiveUp(errors.ClientError):
    """Too many consecutive polls failed; the job's fate is unknown, not decided."""


class WaitTimeout(errors.ClientError):
    """The caller's own bound on a wait passed (deadline exceeded)."""


def seconds_text(seconds: float) -> str:
    """A bound for a message, as ``5m0s``."""
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:g}s"
    hours, rest = divmod(whole, 3600)
    text = f"{rest // 60}m{rest % 60}s"
    return f"{hours}h{text}" if hours else text


class UntilScheduled:
    """Until the job leaves the queue; the job returned may be terminal
    without ever having started: the caller checks."""

    poll_timeout = SCHEDULED_POLL_TIMEOUT
    give_up = SCHEDULED_GIVE_UP

    def __init__(self, job_id: str, deadline: float | None) -> None:
        #: A ``monotonic`` instant; None waits as long as it takes.
        self.deadline = deadline
        self.job_id = job_id
        self.failures = 0

    def timeout(self, now: float) -> float:
        """The next poll's bound; raises ``WaitTimeout`` once the deadline has passed."""
        if self.deadline is None:
            return self.poll_timeout
        remaining = self.deadline - now
        if remaining <= 0:
            raise WaitTimeout(self.expired())
        return min(self.poll_timeout, remaining)

    def failed(self, error: errors.ClientError) -> None:
        """One more failed poll; raises ``PollGiveUp`` at the limit."""
        self.failures += 1
        if self.failures >= self.give_up:
            raise PollGiveUp(self.given_up(error)) from error

    def reached(self, view: PolledJob) -> bool:
        """Whether the polled job is where this wait ends."""
        self.failures = 0
        return view.state != JobState.QUEUED

    def pause(self, now: float) -> float:
        """How long to wait before the next poll, never past the deadline."""
        if self.deadline is None:
            return POLL_INTERVAL
        return max(0.0, min(POLL_INTERVAL, self.deadline - now))

    def expired(self) -> str:
        return "deadline exceeded"

    def given_up(self, error: errors.ClientError) -> str:
        return (
            f"gave up polling job {self.job_id} after {self.failures} consecutive failures"
            f" (last: {error})"
        )


class UntilTerminal(UntilScheduled):
    """Until the job ends; messages name its last known state."""

    poll_timeout = TERMINAL_POLL_TIMEOUT
    give_up = TERMINAL_GIVE_UP

    def __init__(self, job_id: str, bound: float | None, now: float) -> None:
        super().__init__(job_id, None if bound is None else now + bound)
        self.bound = bound
        self.last_state = "unknown"

    def reached(self, view: PolledJob) -> bool:
        self.failures = 0
        self.last_state = view.state or self.last_state
        return view.state in TERMINAL

    def expired(self) -> str:
        bound = seconds_text(self.bound or 0.0)
        return (
            f"job {self.job_id} did not finish within {bound} (last known state: {self.last_state})"
        )

    def given_up(self, error: errors.ClientError) -> str:
        return (
            f"gave up waiting for job {self.job_id} after {self.failures} consecutive failed"
            f" polls (last known state: {self.last_state}; last error: {error})"
        )


class StreamResume:
    """Following a job's output to its end: a broken stream is reopened at
    the byte offset already delivered, so nothing is lost or repeated, until
    ``STREAM_GIVE_UP`` attempts in a row deliver nothing."""

    #: The pause before reopening a broken stream.
    pause = POLL_INTERVAL

    def __init__(self, *, reconnect: bool = True) -> None:
        #: With ``reconnect=False`` the first break is final.
        self.reconnect = reconnect
        #: Bytes delivered so far: where the next stream starts.
        self.offset = 0
        self.failures = 0

    def delivered(self, chunk: bytes) -> None:
        """A chunk reached the caller: the offset moves on and the failures start over."""
        self.offset += len(chunk)
        self.failures = 0

    def broke(self) -> bool:
        """One more broken stream; whether it is final (the caller re-raises it)."""
        self.failures += 1
        return not self.reconnect or self.failures >= STREAM_GIVE_UP
