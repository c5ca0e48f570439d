"""``rc run``: submit, wait in the queue, stream, exit with the job's code (CLI §4).

The command is one state machine (CLI §4.3)::

    SUBMIT -> [WAIT_QUEUE] -> ANNOUNCE -> STREAM -> WAIT_TERMINAL -> EXIT

An interrupt means something different in each phase, which is why the phase is
recorded before each step and consulted in one place:

- during SUBMIT it is an ordinary failure (exit 1): whether the job exists is unknown;
- during WAIT_QUEUE the job holds nothing, so it is CANCELled (exit 130);
- once announced the job holds a device and a live process, so ``rc`` DETACHes and
  leaves it running (exit 130): a lost terminal must never free a device that may
  still be in use.

The first signal already restored the default handlers (``signals``), so a second
Ctrl-C during the cancel request kills ``rc`` at once.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence

from resource_controller import errors
from resource_controller.cli import basics, render, signals
from resource_controller.client import api
from resource_controller.core.states import JobState

#: Bound on the final wait after the stream ends.
FINAL_WAIT = 300.0
#: Bound on cancelling an abandoned queued job.
CANCEL_BOUND = 10.0
#: How long a detach may spend asking whether the job already ended.
DETACH_CHECK = 2.0
#: Exit code on interrupt.
EXIT_INTERRUPTED = 130
#: Where the controller's no-wait refusal goes on to say who holds the device.
NOT_QUEUED = "the job was not queued: "
#: What ``rc`` says when the controller gave no reason.
NO_DETAIL = "no further detail"


class RunRequest:
    """What the user asked ``rc run`` for, validated and converted to wire units.

    A plain class rather than a dataclass: ``dataclasses`` (with ``inspect``) costs
    ``rc run`` more to import than this whole module. Compared by value.
    """

    __slots__ = (
        "after",
        "after_any",
        "command",
        "count",
        "cwd",
        "device",
        "device_ids",
        "env",
        "idle_timeout_seconds",
        "interactive",
        "max_runtime_seconds",
        "no_wait",
        "priority",
        "selector",
        "timeout",
        "tty",
    )

    def __init__(
        self,
        command: Sequence[str],
        device: str = "",
        selector: str = "",
        count: int = 1,
        device_ids: Sequence[str] = (),
        cwd: str = "",
        env: Mapping[str, str] | None = None,
        priority: int = 0,
        max_runtime_seconds: int = 0,
        idle_timeout_seconds: int = 0,
        timeout: float = 0.0,
        no_wait: bool = False,
        tty: bool = False,
        interactive: bool = False,
        after: Sequence[str] = (),
        after_any: bool = False,
    ) -> None:
        self.command = command
        self.device = device
        self.selector = selector
        #: Several devices on one host, by count or by a list of IDs.
        self.count = count
        self.device_ids = device_ids
        self.cwd = cwd
        self.env: Mapping[str, str] = {} if env is None else env
        self.priority = priority
        self.max_runtime_seconds = max_runtime_seconds
        self.idle_timeout_seconds = idle_timeout_seconds
        #: Seconds to wait in the queue before giving up; <= 0 waits forever.
        self.timeout = timeout
        self.no_wait = no_wait
        #: ``--tty``: attach this terminal to a PTY on the box (CLI §4.5).
        self.tty = tty
        #: ``-i``: forward this process's stdin to the job, over pipe mode.
        self.interactive = interactive
        #: The jobs (IDs or unique prefixes) it waits for; any end will do
        #: with ``after_any``, else only success.
        self.after = after
        self.after_any = after_any

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunRequest) and self._values() == other._values()

    def __hash__(self) -> int:
        return hash(tuple(repr(v) for v in self._values()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"RunRequest({fields})"

    @property
    def target(self) -> str:
        """What the user gave to pick a device, verbatim (``<target>``)."""
        return ",".join(self.device_ids) or self.device or self.selector or "any device"


#: CLI-050's mapping of a job's code, shared with the Python API's ``run()``.
exit_status = api.exit_status


class _Progress:
    """How far the run got; decides what an interrupt means."""

    def __init__(self) -> None:
        self.phase = "submit"
        self.job_id = ""
        self.device = ""


def run(client: api.JsonClient, req: RunRequest) -> int:
    """Carry out ``rc run`` and return its exit code; failures raise ``basics.Failure``."""
    _run_nested_if_held(client, req)
    progress = _Progress()
    try:
        return _run(client, req, progress)
    except signals.Interrupted:
        if progress.phase == "queue":
            cancel(client, progress.job_id)
            return EXIT_INTERRUPTED
        if progress.phase == "attached":
            signals.restore_defaults()
            return _detached(client, progress, relayed=req.tty or req.interactive)
        raise


def _detached(client: api.JsonClient, progress: _Progress, *, relayed: bool) -> int:
    """DETACH: say what becomes of the job, truthfully, and how to reach it.

    A job that already ended is not "still running": its own exit code stands. A
    relayed job's terminal or pipe is this process: the worker ends it once we are gone
    (reason ``client left``), so saying it holds the device would be wrong too.
    """
    job_id, device = progress.job_id, progress.device
    try:
        job = client.get_job(job_id, timeout=DETACH_CHECK).job
    except errors.ClientError:
        job = {}
    if job.get("state") in api.TERMINAL_STATES:
        render.say(f"job {job_id} had already ended ({job.get('state')})")
        return _exit_code(job)
    if relayed:
        render.say(
            f"detached from job {job_id} on {device}: its terminal or stdio went with rc, so"
            f" the worker ends it (reason: client left); watch it with rc ps"
        )
        return EXIT_INTERRUPTED
    render.say(
        f"detached from job {job_id}; it is STILL RUNNING on {device} and holds it until it"
        f" finishes (watch it with rc ps; rc attach {job_id} follows it again,"
        f" rc kill {job_id} stops it)"
    )
    return EXIT_INTERRUPTED


def _run_nested_if_held(client: api.JsonClient, req: RunRequest) -> None:
    """EXT-NEST-1: inside a job, a request the job's own lease answers runs under it
    (``cli/nest.py``); this returns only when a new lease is needed."""
    from resource_controller.cli import nest

    lease = nest.current_lease(os.environ)
    if lease is None:
        return
    device = nest.chosen_device(
        lease, req.device, req.selector, lambda s: client.explain(s).get("matching") or []
    )
    if device is None:
        return
    nest.refuse_limits(lease, req.max_runtime_seconds, req.idle_timeout_seconds)
    nest.exec_command(lease, device, req.command, req.cwd, req.env)


def _run(client: api.JsonClient, req: RunRequest, progress: _Progress) -> int:
    # Prefixes resolve as for rc logs, before the submit.
    after = client.resolve_job_ids(req.after) if req.after else []
    try:
        job = client.submit(
            req.command,
            device=req.device,
            selector=req.selector,
            count=req.count,
            device_ids=req.device_ids,
            cwd=req.cwd,
            env=req.env,
            priority=req.priority,
            max_runtime_seconds=req.max_runtime_seconds,
            idle_timeout_seconds=req.idle_timeout_seconds,
            no_wait=req.no_wait,
            stdio=_stdio(req),
            after=after,
            after_any=req.after_any,
        )
    except errors.NoDeviceError as e:
        # CLI-104, extended by EXT-WHY-2: name the holder the controller named.
        _, named, why = e.message.partition(NOT_QUEUED)
        detail = f": {why}" if named and why else ""
        raise basics.Failure(f"{req.target} is busy and could not be queued{detail}") from e
    progress.job_id = job_id = str(job.get("id", ""))
    if job.get("state") == "queued":
        progress.phase = "queue"
        job = wait_queue(client, job_id, req.target, timeout=req.timeout)
    if job.get("state") in api.TERMINAL_STATES and not job.get("started_at"):
        # Ended in the queue, or by its submit's pass (a job it named had failed).
        device = basics.devices_text(job) or req.target
        raise basics.Failure(
            f"job {job_id} {job.get('state')}, never started on {device}:"
            f" {job.get('kill_reason') or NO_DETAIL}"
        )
    progress.device = basics.devices_text(job)
    progress.phase = "attached"
    render.say(f"job {job_id} on {progress.device}")
    if req.tty:
        _attach_terminal(client, job_id)
    elif req.interactive:
        from resource_controller.cli import stdin

        stdin.forward(client, job_id)
    else:
        _stream(client, job_id)
    try:
        final = client.wait_until_terminal(job_id, bound=FINAL_WAIT)
    except errors.ClientError as e:
        raise basics.Failure(str(e)) from e
    return _exit_code(final)


def wait_queue(
    client: api.JsonClient, job_id: str, target: str, *, timeout: float = 0.0, kind: str = "job"
) -> api.Json:
    """WAIT_QUEUE (CLI-106, CLI-107; CLI-122 for a hold): the job once it left the queue.

    Prints each new position; ``timeout`` > 0 is the caller's own deadline, counted
    from now, after which the job is CANCELled. A poll give-up fails without touching
    the job. Shared by ``rc run`` and ``rc hold`` (``kind`` names it in messages).
    """
    deadline = time.monotonic() + timeout if timeout > 0 else None
    report = QueueReport(target)
    try:
        return client.wait_until_scheduled(job_id, on_view=report, deadline=deadline)
    except errors.ClientError as e:
        # Decide "my own --timeout passed" from the clock, never from the error: a
        # per-poll timeout against a wedged controller looks the same.
        if deadline is not None and time.monotonic() >= deadline:
            signals.restore_defaults()
            cancel(client, job_id)
            raise basics.Failure(f"gave up waiting for {target} (deadline exceeded)") from e
        after = "granted" if kind == "hold" else "running"
        raise basics.Failure(
            f"lost track of {kind} {job_id} while it was queued ({e}); it may still be queued"
            f" or already {after}: check rc ps"
        ) from e


class QueueReport:
    """The queued line: printed for each new position and, with what the job
    waits for appended, again whenever that changes.

    ``rc: queued at position 1 for box:gpu0 — held by alice (job 1b2c3d4e…, hold
    "profiling") for 12m0s, at most until 2026-08-13T14:30:00Z``. The "for" duration is
    measured on the local clock from the controller's ``since``; a change of
    that duration alone is not a change. A controller that sends no ``waiting_for``
    gets the base line.
    """

    def __init__(self, target: str, clock: Callable[[], float] = time.time) -> None:
        self.target = target
        self.clock = clock
        self.last: tuple[int, tuple[object, ...]] | None = None

    def __call__(self, view: api.PolledJob) -> None:
        from resource_controller.core import waiting  # only a queued run pays for it

        blockers = waiting.blockers_from_wire(view.waiting_for)
        seen = (view.queue_position, tuple(blockers))
        if seen == self.last:
            return
        self.last = seen
        line = f"queued at position {view.queue_position} for {self.target}"
        if blockers:
            job = view.job
            pinned = not job.get("selector") and bool(job.get("device_id"))
            now = int(self.clock())
            line += " — " + waiting.summary(blockers, now, pinned=pinned)
        render.say(line)


def cancel(client: api.JsonClient, job_id: str) -> None:
    """CANCEL: kill the queued job, then say what became of it.

    The caller has restored default signal handling (the first signal does that).
    """
    end = time.monotonic() + CANCEL_BOUND

    def remaining() -> float:
        return max(0.1, end - time.monotonic())

    try:
        client.kill(job_id, timeout=remaining())
        refused = False
    except errors.NotCancellableError:
        refused = True
    except errors.ClientError as e:
        render.say(f"could not cancel queued job {job_id}: {e}")
        return
    try:
        job: api.Json | None = client.get_job(job_id, timeout=remaining()).job
    except errors.ClientError:
        job = None
    active = job is not None and job.get("state") in api.ACTIVE_STATES
    device = (job or {}).get("device_id") or "its device"
    if not refused:
        if active:
            render.say(
                f"job {job_id} started on {device} just as it was being cancelled;"
                " a kill was requested and it is being terminated"
            )
        elif job is not None:
            render.say(f"cancelled queued job {job_id}")
        else:
            render.say(f"a kill was requested for job {job_id}")
    elif active:
        render.say(
            f"could not cancel job {job_id}: it is STILL RUNNING on {device} and holds it"
            " until it finishes; watch it with rc ps"
        )
    else:
        render.say(f"job {job_id} finished before it could be cancelled")


def _stdio(req: RunRequest) -> str:
    """The submit's ``stdio``: ``tty`` only with ``--tty``; ``pipe`` for ``-i``."""
    return "tty" if req.tty else "pipe" if req.interactive else ""


def _attach_terminal(client: api.JsonClient, job_id: str) -> None:
    """TTY: the session; then WAIT_TERMINAL as after a stream."""
    from resource_controller.cli import tty

    try:
        tty.attach(client, job_id)
    except tty.NotATerminal as e:
        # Found only after the submit; nobody will ever type into this shell,
        # so it is killed rather than left holding the device (allowed by the spec).
        render.say(f"log stream ended: {e}")
        try:
            client.kill(job_id, timeout=CANCEL_BOUND)
        except errors.ClientError as kill_error:
            render.say(f"could not kill job {job_id}: {kill_error}")


def _stream(client: api.JsonClient, job_id: str) -> None:
    """STREAM: copy the job's output to stdout, chunk by chunk, flushed."""

    def on_break(e: errors.ClientError) -> None:
        render.say(f"log stream broke ({e}); reconnecting")

    chunks = client.output(job_id, on_break=on_break)
    try:
        for chunk in chunks:
            render.write_bytes(chunk)
    except errors.ClientError as e:
        render.say(f"log stream ended: {e}")
    except (OSError, ValueError) as e:
        render.say(f"log stream ended: cannot write output: {e}")
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def _exit_code(job: api.Json) -> int:
    """EXIT: the job's code, 1 for a non-success without one, else 0."""
    job_id = job.get("id", "")
    code = job.get("exit_code")
    reason = job.get("kill_reason") or ""
    if isinstance(code, int) and code != 0:
        if reason:
            render.say(f"job {job_id}: {reason}")
        return exit_status(code)
    state = job.get("state")
    if state != JobState.SUCCEEDED:
        raise basics.Failure(f"job {job_id} {state}: {reason or NO_DETAIL}")
    return 0
