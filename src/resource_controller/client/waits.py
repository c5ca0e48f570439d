"""Waiting for a job, and following its output, as operations without I/O (``calls``).

A ``Wait`` is the rules of one polling wait (CLI-077, CLI-078): how long a poll may
take, whether the caller's deadline has passed, when failed polls give up, whether
the job is where it was awaited; ``until`` carries them out. ``follow`` reads a job's
output to its end, reopening a broken or moved stream at the byte offset it reached
(EXT-CLI-5), so nothing is lost or repeated.

The library's waits give up after so many failed polls in a row (``give_up``); ``rc
run`` waits out an outage instead (``quiet``: how long it goes on hearing from no
controller before it says it lost contact), because it must never report a failure it
did not see.
"""

from __future__ import annotations

from resource_controller import errors
from resource_controller.client import calls
from resource_controller.core.states import TERMINAL, JobState

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from collections.abc import Callable

    from resource_controller.client.calls import Op, PolledJob

#: Pause between polls in both wait loops (CLI-190).
POLL_INTERVAL = 0.5
#: Per-poll timeout and the failure count that gives up, wait-until-scheduled (CLI-191).
SCHEDULED_POLL_TIMEOUT = 1.0
SCHEDULED_GIVE_UP = 17
#: The same for wait-until-terminal (CLI-192).
TERMINAL_POLL_TIMEOUT = 10.0
TERMINAL_GIVE_UP = 6
#: How long a wait or a follow goes on hearing from no controller before it says it lost
#: contact, where it waits out an outage (``rc run``: its final wait's bound, CLI-193).
QUIET = 300.0
#: That bound while no controller even takes a connection (every URL refused: none is
#: running, as after ``rc up`` stopped); a restarting one is back well within it.
GONE = 30.0
#: How long a follow stays silent before the job is asked after (a follow may be quiet
#: for long, API-009; the answer shows whether the requests moved to another controller),
#: and that question's bound.
FOLLOW_IDLE = 5.0
SILENCE_POLL = 3.0
#: How long a follow stays broken before it is said: a failover to the next controller
#: resumes well within it, and the user need not hear of one.
SAY_BROKEN_AFTER = 5.0


class PollGiveUp(errors.ClientError):
    """Too many consecutive polls failed; the job's fate is unknown, not decided."""


class WaitTimeout(errors.ClientError):
    """The caller's own bound on a wait passed (deadline exceeded)."""


class LostContact(PollGiveUp):
    """No controller answered about the job for too long: how it ends is unknown, and
    the job is left alone (``rc run``'s exit 75). ``job_id`` names it."""

    def __init__(self, message: str, job_id: str) -> None:
        super().__init__(message)
        self.job_id = job_id


def seconds_text(seconds: float) -> str:
    """A bound for a message, as ``5m0s``."""
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:g}s"
    hours, rest = divmod(whole, 3600)
    text = f"{rest // 60}m{rest % 60}s"
    return f"{hours}h{text}" if hours else text


class Wait:
    """One polling wait for ``job_id``: until it leaves the queue (the job returned may
    be terminal without having started: the caller checks) or, ``terminal``, until it
    ends. ``deadline`` is a clock instant past which the wait raises ``WaitTimeout``
    (``bound``: the length it stands for, named in the message). Failed polls raise
    ``PollGiveUp`` at the ``give_up``-th in a row, or ``LostContact`` once no poll
    succeeded for ``quiet`` seconds; ``report`` turns a queued view into a line to say.
    """

    def __init__(
        self,
        job_id: str,
        *,
        terminal: bool = False,
        now: float,
        deadline: float | None = None,
        bound: float | None = None,
        give_up: int | None = None,
        quiet: float | None = None,
        report: Callable[[PolledJob], str] | None = None,
    ) -> None:
        self.job_id = job_id
        self.terminal = terminal
        self.deadline = deadline
        self.bound = bound
        self.poll_timeout = TERMINAL_POLL_TIMEOUT if terminal else SCHEDULED_POLL_TIMEOUT
        if give_up is None and quiet is None:
            give_up = TERMINAL_GIVE_UP if terminal else SCHEDULED_GIVE_UP
        self.give_up = give_up
        self.quiet = quiet
        self.report = report
        self.failures = 0
        self.heard = now
        self.last_state = "unknown"

    def timeout(self, now: float) -> float:
        """The next poll's bound; raises ``WaitTimeout`` once the deadline has passed."""
        if self.deadline is None:
            return self.poll_timeout
        remaining = self.deadline - now
        if remaining <= 0:
            if self.terminal:
                raise WaitTimeout(
                    f"job {self.job_id} did not finish within {seconds_text(self.bound or 0)}"
                    f" (last known state: {self.last_state})"
                )
            raise WaitTimeout("deadline exceeded")
        return min(self.poll_timeout, remaining)

    def failed(self, error: errors.ClientError, now: float) -> None:
        """One more failed poll; raises once the wait gives up."""
        self.failures += 1
        if self.quiet is not None and now - self.heard >= (quiet := _quiet(self.quiet, error)):
            raise LostContact(
                f"no controller answered about job {self.job_id} for"
                f" {seconds_text(quiet)} (last known state: {self.last_state};"
                f" last error: {error})",
                self.job_id,
            ) from error
        if self.give_up is None or self.failures < self.give_up:
            return
        if self.terminal:
            raise PollGiveUp(
                f"gave up waiting for job {self.job_id} after {self.failures} consecutive failed"
                f" polls (last known state: {self.last_state}; last error: {error})"
            ) from error
        raise PollGiveUp(
            f"gave up polling job {self.job_id} after {self.failures} consecutive failures"
            f" (last: {error})"
        ) from error

    def reached(self, view: PolledJob, now: float) -> bool:
        """Whether the polled job is where this wait ends."""
        self.failures = 0
        self.heard = now
        self.last_state = view.state or self.last_state
        return view.state in TERMINAL if self.terminal else view.state != JobState.QUEUED

    def pause(self, now: float) -> float:
        """How long to wait before the next poll, never past the deadline."""
        if self.deadline is None:
            return POLL_INTERVAL
        return max(0.0, min(POLL_INTERVAL, self.deadline - now))


def _quiet(quiet: float, error: errors.ClientError) -> float:
    """How long hearing nothing may last, after ``error``: ``GONE`` while none connects."""
    return min(quiet, GONE) if isinstance(error, errors.ConnectFailed) else quiet


def until(wait: Wait, now: Callable[[], float]) -> Op[PolledJob]:
    """Poll until ``wait`` says the job is where it was awaited; the last view."""
    while True:
        bound = wait.timeout(now())  # a passed deadline is no failed poll
        try:
            view: PolledJob = yield calls.get_job(wait.job_id, bound)
        except errors.ClientError as e:
            wait.failed(e, now())
        else:
            if wait.reached(view, now()):
                return view
            line = wait.report(view) if wait.report is not None else ""
            if line:
                yield calls.Note(line)
        yield calls.Sleep(wait.pause(now()))


def follow(
    job_id: str,
    now: Callable[[], float],
    quiet: float,
    sink: Callable[[bytes], object] | None = None,
    report: Callable[[PolledJob], str] | None = None,
) -> Op[None]:
    """The job's output to its end, handed to ``sink`` (else as ``Out`` steps), resuming
    where a stream stopped; ``report`` puts each silence's look at the job in words.

    A stream that breaks, or that another controller now answers for (its silence
    made the job be asked after, and the answer came from elsewhere), is reopened at
    the offset delivered. A refusal (``not_found``, ``logs_not_stored``) is raised at
    once; a controller answering 5xx, or none answering, is waited out until nothing was
    heard for ``quiet`` seconds (``LostContact``). An interruption that outlasts
    ``SAY_BROKEN_AFTER`` is said, once.
    """
    offset = 0
    heard = now()
    stream = None
    noted = False
    broken: float | None = None  # since when no stream was open
    while True:
        error: errors.ClientError | None = None
        if stream is None:
            try:
                stream = yield calls.Open(calls.logs(job_id, offset=offset))
            except errors.ApiError as e:
                if e.status < 500:
                    raise
                error = e
            except errors.TransportError as e:
                error = e
            else:
                broken = None
        if stream is not None:
            try:
                chunk = yield calls.Read(stream, FOLLOW_IDLE)
            except errors.TransportError as e:
                yield calls.Close(stream)
                stream, error = None, e
            else:
                if chunk:
                    heard = now()
                    offset += len(chunk)
                    if sink is None:
                        yield calls.Out(chunk)
                    else:
                        sink(chunk)
                    continue
                if chunk is not None:
                    return  # the follow ended: the job has
                try:
                    view = yield calls.get_job(job_id, SILENCE_POLL)
                except errors.ClientError as e:
                    error = e
                else:
                    heard = now()
                    if report is not None and (line := report(view)):
                        yield calls.Note(line)
                    if view.state in TERMINAL or (yield calls.Where()) != stream.base:
                        yield calls.Close(stream)
                        stream = None
                    continue
        if error is None:
            continue
        if now() - heard >= (bound := _quiet(quiet, error)):
            raise LostContact(
                f"no controller answered about job {job_id} for {seconds_text(bound)}"
                f" (last error: {error})",
                job_id,
            ) from error
        broken = now() if broken is None else broken
        if not noted and stream is None and now() - broken >= SAY_BROKEN_AFTER:
            noted = True
            yield calls.Note(f"log stream interrupted ({error}); resuming where it stopped")
        if stream is None:
            yield calls.Sleep(POLL_INTERVAL)
