"""``rc run`` as one state machine without I/O (CLI §4.3), for ``rc run``, ``Client.run``
and ``AsyncClient.run`` alike::

    SUBMIT -> [WAIT_QUEUE] -> ANNOUNCE -> STREAM (or RELAY) -> WAIT_TERMINAL -> EXIT

It is an operation of ``calls``: it yields requests, pauses and lines to say, and its
driver sends back what they gave. An interrupt (Ctrl-C, an ``rc`` signal, a cancelled
task) is thrown in where it lands, and means what the phase makes it mean:

- during SUBMIT it is an ordinary failure (whether the job exists is unknown);
- during WAIT_QUEUE the job holds nothing, so it is CANCELled;
- once announced the job holds a device and a live process, so the run DETACHes and
  leaves it running: a lost terminal must never free a device that may be in use.

An outage is waited out, not reported: a submit is tried again for ``SUBMIT_WAIT``
(its idempotency key makes that safe), and polls and the output go on through failures
until no controller was heard from for ``FINAL_WAIT``. Past that the run ends
``lost`` (``EXIT_LOST``) and says where to read the job's result: it never reports a
failure it did not see.
"""

from __future__ import annotations

import contextlib

from resource_controller import errors
from resource_controller.client import calls, waits
from resource_controller.client.calls import Note
from resource_controller.core.states import ACTIVE, TERMINAL, JobState

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from collections.abc import Callable

    from resource_controller.client.calls import Json, Op, PolledJob
    from resource_controller.client.submit import Submit

#: Bound on the final wait, and on hearing from no controller at all (CLI-193).
FINAL_WAIT = waits.QUIET
#: Bound on cancelling an abandoned queued job (CLI-194).
CANCEL_BOUND = 10.0
#: How long a detach may spend asking whether the job already ended.
DETACH_CHECK = 2.0
#: How long a submit the controller could not take (no answer, a 5xx) is tried again,
#: and the pause between tries.
SUBMIT_WAIT = 30.0
SUBMIT_PAUSE = 1.0
#: Exit codes of their own: interrupted (CLI-197), and contact lost before the end was
#: seen (the job's fate unknown; sysexits' EX_TEMPFAIL: ask again later).
EXIT_INTERRUPTED = 130
EXIT_LOST = 75
#: What ``rc`` says when the controller gave no reason.
NO_DETAIL = "no further detail"


class RunEnd:
    """How a run (or a hold's wait in the queue) ended, and the exit code it earns.

    ``kind``: ``ended`` (the job's end was seen, ``code`` as CLI-114 has it),
    ``never_started``, ``gave_up`` (its own ``--timeout``; cancelled), ``lost``,
    ``interrupted`` (while queued; cancelled), ``detached``, ``count`` (the controller
    ignored ``count``; killed). ``message`` is the line to say, if any; ``interrupt``
    the interrupt that ended it, for the Python API to raise again.
    """

    __slots__ = ("code", "interrupt", "job", "kind", "message")

    def __init__(
        self,
        code: int,
        job: Json,
        message: str = "",
        kind: str = "ended",
        interrupt: BaseException | None = None,
    ) -> None:
        self.code, self.job, self.message, self.kind = code, job, message, kind
        self.interrupt = interrupt

    def __repr__(self) -> str:
        return f"RunEnd({self.code}, {self.kind!r}, {self.message!r})"


def _interrupt(exc: BaseException) -> bool:
    """An interrupt (``KeyboardInterrupt``, ``rc``'s signal, a task's cancellation): any
    ``BaseException`` but an error and the generator's own exit."""
    return not isinstance(exc, Exception | GeneratorExit)


def devices_text(job: Json) -> str:
    """A job's devices for a message: ``a,b`` for several, else its device."""
    ids = job.get("device_ids")
    if isinstance(ids, list) and len(ids) > 1:
        return ",".join(str(i) for i in ids)
    return str(job.get("device_id") or "")


def submit(spec: Submit, submitter: str, now: Callable[[], float]) -> Op[Json]:
    """SUBMIT: the job created, ``after``'s prefixes resolved first. A controller that
    does not answer, or answers 5xx (a database outage), is tried again for
    ``SUBMIT_WAIT``, said once; a refusal is raised at once, and so is a controller
    nobody could connect to (CLI-043: reported at once, with where its URL came from).
    """
    give_up = now() + SUBMIT_WAIT
    said = False
    while True:
        try:
            after = yield from calls.resolve_all(spec.after)
            job: Json = yield calls.submit(spec, submitter, after)
            break
        except (errors.TransportError, errors.ApiError) as e:
            lasting = isinstance(e, errors.ApiError) and e.status < 500
            if lasting or isinstance(e, errors.ConnectFailed) or now() >= give_up:
                raise
            if not said:
                said = True
                what = "hold" if spec.kind == "hold" else "job"
                yield Note(
                    f"the controller cannot take the {what} now ({e}); trying again for up to"
                    f" {waits.seconds_text(SUBMIT_WAIT)}"
                )
            yield calls.Sleep(SUBMIT_PAUSE)
    try:
        yield calls.Sleep(0)  # where an interrupt the Python API held back lands
    except BaseException as e:
        if _interrupt(e):  # nobody will wait for this job: it must not keep a place
            with contextlib.suppress(errors.ClientError):
                yield calls.kill(str(job.get("id", "")), submitter, CANCEL_BOUND)
        raise
    return job


def queue(
    job_id: str,
    target: str,
    submitter: str,
    now: Callable[[], float],
    *,
    timeout: float = 0.0,
    kind: str = "job",
    wall: Callable[[], float] | None = None,
) -> Op[Json | RunEnd]:
    """WAIT_QUEUE (CLI-106, CLI-107): the job once it left the queue, or how the wait
    ended. ``timeout`` > 0 is the caller's own deadline, counted from now."""
    deadline = now() + timeout if timeout > 0 else None
    report = QueueReport(target, wall)
    wait = waits.Wait(job_id, now=now(), deadline=deadline, quiet=FINAL_WAIT, report=report)
    try:
        return (yield from waits.until(wait, now)).job
    except errors.ClientError as e:
        # "My own --timeout passed" is read off the clock, never the error (CLI-079).
        if deadline is not None and now() >= deadline:
            yield from cancel(job_id, submitter, now)
            message = f"gave up waiting for {target} (deadline exceeded)"
            return RunEnd(1, {"id": job_id}, message, "gave_up")
        after = "granted" if kind == "hold" else "running"
        message = (
            f"lost track of {kind} {job_id} while it was queued ({e}); it may still be queued"
            f" or already {after}: check rc ps"
        )
        return RunEnd(EXIT_LOST, {"id": job_id}, message, "lost")
    except BaseException as e:
        if not _interrupt(e):
            raise
        yield from cancel(job_id, submitter, now)
        return RunEnd(EXIT_INTERRUPTED, {"id": job_id}, "", "interrupted", e)


def cancel(job_id: str, submitter: str, now: Callable[[], float]) -> Op[None]:
    """CANCEL (CLI-109): kill the queued job, then say what became of it, all bounded."""
    end = now() + CANCEL_BOUND
    try:
        yield calls.kill(job_id, submitter, max(0.1, end - now()))
        refused = False
    except errors.NotCancellableError:
        refused = True
    except errors.ClientError as e:
        yield Note(f"could not cancel queued job {job_id}: {e}")
        return
    try:
        job: Json | None = (yield calls.get_job(job_id, max(0.1, end - now()))).job
    except errors.ClientError:
        job = None
    active = job is not None and job.get("state") in ACTIVE
    device = (job or {}).get("device_id") or "its device"
    if not refused:
        if active:
            yield Note(
                f"job {job_id} started on {device} just as it was being cancelled;"
                " a kill was requested and it is being terminated"
            )
        elif job is not None:
            yield Note(f"cancelled queued job {job_id}")
        else:
            yield Note(f"a kill was requested for job {job_id}")
    elif active:
        yield Note(
            f"could not cancel job {job_id}: it is STILL RUNNING on {device} and holds it"
            " until it finishes; watch it with rc ps"
        )
    else:
        yield Note(f"job {job_id} finished before it could be cancelled")


def never_started(job: Json, target: str, kind: str = "job") -> RunEnd | None:
    """CLI-108: a job that left the queue terminal without ever starting."""
    if job.get("state") not in TERMINAL or job.get("started_at"):
        return None
    message = (
        f"{kind} {job.get('id', '')} {job.get('state')}, never"
        f" {'granted' if kind == 'hold' else 'started'} on {devices_text(job) or target}:"
        f" {job.get('kill_reason') or NO_DETAIL}"
    )
    return RunEnd(1, job, message, "never_started")


def count_shortfall(job: Json, count: int) -> str:
    """Why a placed job does not hold the ``count`` devices asked for, or ``""``.

    A controller without EXT-GANG ignores ``count``; running such a job on one device
    would be a flag accepted and ignored, so the job is killed and the run refused.
    """
    if count <= 1 or job.get("state") == "queued":
        return ""
    ids = job.get("device_ids")
    held = len(ids) if isinstance(ids, list) and ids else (1 if job.get("device_id") else 0)
    if held >= count or (job.get("state") in TERMINAL and not job.get("started_at")):
        return ""
    return (
        f"asked for {count} devices but the controller placed job {job.get('id')} on {held}:"
        " it does not support count (EXT-GANG); the job was killed"
    )


def placed(spec: Submit, submitter: str, job: Json) -> Op[RunEnd | None]:
    """The checks on a job that left the queue: ended without starting, or placed on
    fewer devices than asked for (then it is killed)."""
    kind = "hold" if spec.kind == "hold" else "job"
    done = never_started(job, spec.target, kind)
    if done is not None:
        return done
    shortfall = count_shortfall(job, spec.count)
    if not shortfall:
        return None
    with contextlib.suppress(errors.ClientError):  # already ended: nothing to free
        yield calls.kill(str(job.get("id", "")), submitter, CANCEL_BOUND)
    return RunEnd(1, job, shortfall, "count")


def run(
    spec: Submit,
    submitter: str,
    now: Callable[[], float],
    *,
    timeout: float = 0.0,
    sink: Callable[[bytes], object] | None = None,
    wall: Callable[[], float] | None = None,
) -> Op[RunEnd]:
    """The whole of ``rc run``: its outcome. The job's output goes to ``sink`` (else as
    ``Out`` steps). Submit errors are raised (a 409 as ``NoDeviceError``); an interrupt
    is handled, then carried in the outcome."""
    job = yield from submit(spec, submitter, now)
    job_id = str(job.get("id", ""))
    if job.get("state") == JobState.QUEUED:
        left = yield from queue(job_id, spec.target, submitter, now, timeout=timeout, wall=wall)
        if isinstance(left, RunEnd):
            return left
        job = left
    refused = yield from placed(spec, submitter, job)
    if refused is not None:
        return refused
    device = devices_text(job)
    yield Note(f"job {job_id} on {device}")
    preempted = PreemptReport()
    try:
        if spec.stdio:
            yield calls.JoinRelay(job_id, spec.stdio)
        else:
            try:
                yield from waits.follow(job_id, now, FINAL_WAIT, sink, preempted)
            except waits.LostContact as e:
                return lost(job, e)
            except errors.ClientError as e:
                yield Note(f"log stream ended: {e}")
            except (OSError, ValueError) as e:  # this side's stdout: the job goes on
                yield Note(f"log stream ended: cannot write output: {e}")
        wait = waits.Wait(
            job_id,
            terminal=True,
            now=now(),
            deadline=now() + FINAL_WAIT,
            bound=FINAL_WAIT,
            quiet=FINAL_WAIT,
        )
        try:
            final = (yield from waits.until(wait, now)).job
        except errors.ClientError as e:
            return lost(job, e)
        for line in preempted.lines(final):
            yield Note(line)
    except BaseException as e:
        if not _interrupt(e):
            raise
        return (yield from detach(job_id, device, bool(spec.stdio), e))
    return ended(final)


def lost(job: Json, error: errors.ClientError) -> RunEnd:
    """The run stops without having seen the job end: it says so and where the result
    will be, and leaves the job alone."""
    job_id = job.get("id", "")
    message = (
        f"lost contact with job {job_id}: {error}; it may still be running, and rc cannot"
        f" tell how it ends: its result will be in rc jobs, its output in rc logs {job_id}"
    )
    return RunEnd(EXIT_LOST, job, message, "lost")


def detach(job_id: str, device: str, relayed: bool, interrupt: BaseException) -> Op[RunEnd]:
    """DETACH (CLI-113): say what becomes of the job, truthfully, and how to reach it.

    A job that already ended is not "still running": its own exit code stands. A
    relayed job's terminal or pipe is this process: the worker ends it once we are gone
    (reason ``client left``), so saying it holds the device would be wrong too.
    """
    try:
        job: Json = (yield calls.get_job(job_id, DETACH_CHECK)).job
    except errors.ClientError:
        job = {"id": job_id}
    if job.get("state") in TERMINAL:
        yield Note(f"job {job_id} had already ended ({job.get('state')})")
        out = ended(job)
        out.interrupt = interrupt
        return out
    if relayed:
        yield Note(
            f"detached from job {job_id} on {device}: its terminal or stdio went with rc, so"
            " the worker ends it (reason: client left); watch it with rc ps"
        )
    else:
        yield Note(
            f"detached from job {job_id}; it is STILL RUNNING on {device} and holds it until it"
            f" finishes (watch it with rc ps; rc attach {job_id} follows it again,"
            f" rc kill {job_id} stops it)"
        )
    return RunEnd(EXIT_INTERRUPTED, job, "", "detached", interrupt)


def ended(job: Json) -> RunEnd:
    """EXIT (CLI-114): the job's code (its reason said), 1 for a non-success without one
    (said as a failure), else 0."""
    job_id = job.get("id", "")
    code = job.get("exit_code")
    reason = job.get("kill_reason") or ""
    if isinstance(code, int) and code != 0:
        return RunEnd(calls.exit_status(code), job, f"job {job_id}: {reason}" if reason else "")
    state = job.get("state")
    if state != JobState.SUCCEEDED:
        return RunEnd(1, job, f"job {job_id} {state}: {reason or NO_DETAIL}")
    return RunEnd(0, job)


class QueueReport:
    """The queued line (CLI-106, EXT-WHY-2): said for each new position and, with what
    the job waits for appended, again whenever that changes.

    ``queued at position 1 for box:gpu0 — held by alice (job 1b2c3d4e…, hold
    "profiling") for 12m0s, at most until 2026-08-13T14:30:00Z``. The "for" duration is
    measured on ``wall`` (the local clock) from the controller's ``since``; a change of
    that duration alone is not a change. A controller that sends no ``waiting_for``
    gets the base line.
    """

    def __init__(self, target: str, wall: Callable[[], float] | None = None) -> None:
        self.target = target
        self.wall = wall
        self.last: tuple[int, tuple[object, ...]] | None = None

    def __call__(self, view: PolledJob) -> str:
        from resource_controller.core import waiting  # only a queued run pays for it

        blockers = waiting.blockers_from_wire(view.waiting_for)
        seen = (view.queue_position, tuple(blockers))
        if seen == self.last:
            return ""
        self.last = seen
        line = f"queued at position {view.queue_position} for {self.target}"
        if blockers:
            import time

            job = view.job
            pinned = not job.get("selector") and bool(job.get("device_id"))
            now = int((self.wall or time.time)())
            line += " — " + waiting.summary(blockers, now, pinned=pinned)
        return line


class PreemptReport:
    """EXT-PREEMPT-2: a victim's run says, once per attempt, that it was preempted and by
    whom (as soon as a look at the job shows it, else at the end); the run goes on waiting
    through the queue for the next attempt."""

    def __init__(self) -> None:
        self.said: set[int] = set()

    def __call__(self, view: PolledJob) -> str:
        return "\n".join(self.lines(view.job))

    def lines(self, job: Json) -> list[str]:
        found: dict[int, str] = {}
        for a in job.get("attempts") or []:
            if isinstance(a, dict) and a.get("state") == "preempted":
                reason = str(a.get("kill_reason") or "")
                found[int(a.get("attempt") or 1)] = reason.removeprefix("preempted by ")
        # A terminal one did not queue again (``--no-requeue``): its end says why it stopped.
        if job.get("preempted_by") and job.get("state") not in TERMINAL:
            found[int(job.get("attempt") or 1)] = str(job["preempted_by"])
        out = []
        for n in sorted(set(found) - self.said):
            self.said.add(n)
            out.append(
                f"job {job.get('id', '')}: attempt {n} preempted by job {found[n]};"
                f" queued again for attempt {n + 1}"
            )
        return out
