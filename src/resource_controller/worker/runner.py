"""Starting one job as a process group, supervising it, and saying how it ended.

Two steps, which the job's lifecycle takes in turn. ``start_job`` builds the
environment and the command and spawns it: directly (no shell), in a new session (so
it leads its own process group), with ``/dev/null`` as stdin and stdout and stderr on
one pipe, so the stored log is the interleaving the job actually produced.
``supervise_job`` watches it until it is *complete*: the leader has exited **and** the
pipe reached end of file, so a background child still holding the pipe keeps the job
running. ``run_job`` does both.

While it runs, two watchdogs are checked every ``Timings.watchdog_period`` on the
injected clock. A kill flag, a shutdown and a watchdog trip all take the same
cancellation path: TERM the group, give it ``Timings.kill_grace``, KILL it,
reap stragglers. A clean exit that leaves live members in the group is not a success
either: they are killed and the job is reported killed, because a leader that
exits 0 while its background child keeps the GPU is not an unremarkable success.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from resource_controller import wire
from resource_controller.clock import Clock
from resource_controller.core import durations
from resource_controller.core.cuda import cuda_visible_devices as cuda_visible_devices
from resource_controller.core.cuda import device_index as device_index
from resource_controller.core.states import JobState, Kind
from resource_controller.worker import procs
from resource_controller.worker.timings import DEFAULT, Timings

log = logging.getLogger(__name__)

#: Output is read in blocks of at most this many bytes.
READ_BLOCK = 65_536
#: What a hold runs, whatever the assignment says: 2³¹−1 seconds, which
#: busybox ``sleep`` accepts too.
SLEEPER = ("sleep", "2147483647")

REASON_CANCELLED = "cancelled"
#: A job cancelled because its worker is shutting down (``rc worker`` or ``rc up`` stopped).
REASON_SHUTDOWN = "cancelled: worker stopped"
REASON_SURVIVORS = "cancelled; survivors remained after SIGKILL"
REASON_STRAGGLERS_REAPED = "stragglers reaped after exit"
REASON_STRAGGLERS_REMAINED = "stragglers remained after exit"
REASON_EMPTY_COMMAND = "empty command"


#: Receives each block of output as it is read; awaiting it applies back-pressure.
OutputSink = Callable[[bytes], Awaitable[None]]


@dataclass(frozen=True)
class Outcome:
    """How a process ended, already mapped onto a job state."""

    state: JobState
    #: Exit status, 128+signal for a signal death, -1 when it never started.
    exit_code: int
    #: ``""`` when the outcome needs no explanation (a plain exit).
    reason: str = ""


# ---- environment and command ---------------------------------------------------------


def build_env(
    assignment: wire.Assignment,
    base_env: Mapping[str, str],
    mig_uuids: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The job's environment.

    Worker environment, overlaid with the job's ``env``; ``CUDA_VISIBLE_DEVICES`` from
    the device name (a MIG instance's UUID from ``mig_uuids``, device name → ``MIG-...``)
    unless the job supplied the key (even empty); ``PYTHONUNBUFFERED=1`` unless the job
    set it; and the ``RC_*`` identity variables, which always win.
    """
    job_env = assignment.env or {}
    # Every device, ascending; a controller that sends no list means one.
    device_ids = list(assignment.device_ids or [assignment.device_id])
    env = dict(base_env)
    # A worker started inside a job inherits that job's fencing token and device
    # list; neither describes this job.
    env.pop("RC_LEASE_EPOCH", None)
    env.pop("RC_DEVICES", None)
    env.update(job_env)
    if "CUDA_VISIBLE_DEVICES" not in job_env:
        index = cuda_visible_devices(device_ids, mig_uuids)
        if index is not None:
            env["CUDA_VISIBLE_DEVICES"] = index
    if "PYTHONUNBUFFERED" not in job_env:
        env["PYTHONUNBUFFERED"] = "1"
    env["RC_JOB_ID"] = assignment.job_id
    env["RC_DEVICE"] = device_ids[0]
    env["RC_DEVICES"] = ",".join(device_ids)
    if assignment.lease_epoch:
        env["RC_LEASE_EPOCH"] = str(assignment.lease_epoch)
    return env


def job_argv(assignment: wire.Assignment) -> list[str]:
    """The command to run: the assignment's, or the sleeper for a hold."""
    if assignment.kind == Kind.HOLD:
        return list(SLEEPER)
    return list(assignment.command)


class _StartError(Exception):
    """The process could not be started; the message is the ``<os error>`` text."""


def check_cwd(cwd: str) -> str | None:
    """Why the job cannot run in ``cwd``, naming it, or ``None`` if it can.

    Checked before the spawn, because the error a failed ``chdir`` in the child comes
    back with is easily read as the program's (``exec /usr/bin/pwd: no such file or
    directory``) when the program is fine and the directory is what is missing.
    """
    try:
        st = os.stat(cwd)
    except FileNotFoundError:
        return f"cwd {cwd}: no such directory"
    except OSError as exc:
        return f"cwd {cwd}: {(exc.strerror or str(exc)).lower()}"
    if not stat.S_ISDIR(st.st_mode):
        return f"cwd {cwd}: not a directory"
    if not os.access(cwd, os.X_OK):
        return f"cwd {cwd}: permission denied"
    return None


def _resolve(name: str, env: Mapping[str, str]) -> str:
    """Find the program through ``PATH`` (the job's) when its name has no slash."""
    if "/" in name:
        return name
    for directory in (env.get("PATH") or os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise _StartError(f"exec {name}: executable file not found in $PATH")


# ---- supervision ---------------------------------------------------------------------


class _Protocol(asyncio.SubprocessProtocol):
    """Feeds the output pipe into a reader and notes the leader's exit on its own.

    ``Process.wait()`` from asyncio also waits for the pipes to close, but the
    cancellation path must tell "leader reaped" from "output drained".
    """

    def __init__(self, *, separate_stderr: bool = False) -> None:
        self.output = asyncio.StreamReader(limit=READ_BLOCK)
        #: The stderr pipe's reader, when stderr has a pipe of its own (pipe mode).
        self.errors = asyncio.StreamReader(limit=READ_BLOCK) if separate_stderr else None
        self.exited: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        #: Clear while the stdin pipe's buffer is full (pipe mode feeds it).
        self.writable = asyncio.Event()
        self.writable.set()
        #: Set once the process closed its stdin (or it was never a pipe).
        self.stdin_closed = asyncio.Event()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Duck-typed: uvloop's subprocess transport does not subclass asyncio's.
        get_pipe = getattr(transport, "get_pipe_transport", lambda _fd: None)
        pipe = get_pipe(1)
        if isinstance(pipe, asyncio.ReadTransport):
            self.output.set_transport(pipe)  # lets the reader pause the pipe when full
        err = get_pipe(2)
        if self.errors is not None and isinstance(err, asyncio.ReadTransport):
            self.errors.set_transport(err)

    def _reader(self, fd: int) -> asyncio.StreamReader:
        return self.errors if fd == 2 and self.errors is not None else self.output

    def pipe_data_received(self, fd: int, data: bytes | bytearray) -> None:
        self._reader(fd).feed_data(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 0:
            self.stdin_closed.set()
            self.writable.set()  # nobody waits for room in a pipe that is gone
        else:
            self._reader(fd).feed_eof()

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


class _Activity:
    """When output was last seen, for the idle watchdog."""

    def __init__(self, at: float) -> None:
        self.last = at


async def _pump(
    reader: asyncio.StreamReader, sink: OutputSink, activity: _Activity, clock: Clock
) -> None:
    """Copy ``reader`` into ``sink`` until its end, noting activity for the idle watchdog."""
    while True:
        try:
            chunk = await reader.read(READ_BLOCK)
        except OSError:
            return  # an I/O error on the pipe ends the output like EOF does
        if not chunk:
            return
        activity.last = clock.monotonic()
        try:
            await sink(chunk)
        except Exception:
            # The sink never fails the job; and reading must go on, or the pipe fills
            # and the job blocks on its next write.
            log.exception("output sink failed", extra={"action": "output_sink_failed"})


#: The output copy, for a job's second output stream (pipe mode's stderr).
copy_output = _pump


def exit_code_of(returncode: int | None) -> int:
    """Wait status as a shell reports it: the exit code, or 128+signal."""
    if returncode is None:
        return -1
    return 128 - returncode if returncode < 0 else returncode


def _plain_outcome(returncode: int | None) -> Outcome:
    """The real result of a process nobody signalled."""
    code = exit_code_of(returncode)
    if returncode is not None and returncode < 0:
        return Outcome(JobState.KILLED, code, "signal: " + procs.signal_word(-returncode))
    return Outcome(JobState.SUCCEEDED if code == 0 else JobState.FAILED, code)


async def _after_exit(pgid: procs.Target, returncode: int | None) -> Outcome:
    """A finished process's outcome, after reaping what it left in its group."""
    outcome = _plain_outcome(returncode)
    await procs.settle_group(pgid)
    if procs.target_alive(pgid):
        emptied = await procs.reap_group(pgid)
        reason = REASON_STRAGGLERS_REAPED if emptied else REASON_STRAGGLERS_REMAINED
        log.warning(
            "process group %s had live members after the leader exited: %s",
            pgid,
            reason,
            extra={"action": "stragglers"},
        )
        outcome = Outcome(JobState.KILLED, outcome.exit_code, reason)
    return outcome


@dataclass(eq=False)
class Started:
    """A job's process, spawned and not yet watched: the output is already flowing."""

    pgid: int
    transport: asyncio.SubprocessTransport
    proto: _Protocol
    #: ``clock.monotonic()`` at the spawn: where max runtime and idleness count from.
    at: float
    #: What supervision signals: the group (``pgid``), or a ``tty`` job's session.
    target: procs.Target = 0

    def __post_init__(self) -> None:
        if not self.target:
            self.target = self.pgid
        #: When output was last seen (every output stream of the job feeds it).
        self.activity = _Activity(self.at)


#: The logs-mode standard streams: no input, stdout and stderr on one pipe.
LOGS_STDIO: tuple[Any, Any, Any] = (subprocess.DEVNULL, subprocess.PIPE, subprocess.STDOUT)


async def start(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None,
    clock: Clock,
    stdio: tuple[Any, Any, Any] = LOGS_STDIO,
    preexec: Callable[[], None] | None = None,
) -> Started | Outcome:
    """Spawn ``argv`` in a new session with output on one pipe.

    Returns the start error as an ``Outcome`` when there is nothing to run,
    the directory is unusable or the program cannot be executed. The caller must hand
    a ``Started`` to ``supervise`` at once: only ``supervise`` ever ends the group.
    Attached jobs pass their own ``stdio`` (a terminal, or three pipes) and, for a
    terminal, the ``preexec`` step that makes it the controlling one.
    """
    if not argv:
        return Outcome(JobState.FAILED, -1, REASON_EMPTY_COMMAND)
    if cwd:
        problem = check_cwd(cwd)
        if problem is not None:
            return Outcome(JobState.FAILED, -1, problem)
    try:
        executable = _resolve(argv[0], env)
    except _StartError as exc:
        return Outcome(JobState.FAILED, -1, f"start: {exc}")

    loop = asyncio.get_running_loop()
    proto = _Protocol(separate_stderr=stdio[2] is subprocess.PIPE)
    spawn = asyncio.ensure_future(
        loop.subprocess_exec(
            lambda: proto,
            *argv,
            executable=executable,
            stdin=stdio[0],
            stdout=stdio[1],
            stderr=stdio[2],
            env=dict(env),
            cwd=cwd or None,
            start_new_session=True,
            preexec_fn=preexec,
        )
    )
    try:
        transport, _ = await asyncio.shield(spawn)
    except asyncio.CancelledError:
        # Torn down mid-spawn: the process exists once the fork is done, and asyncio's
        # own clean-up would kill only the leader, leaving its children unsupervised.
        with contextlib.suppress(Exception):
            transport, _ = await asyncio.shield(spawn)
            procs.kill_group_now(transport.get_pid())
            await asyncio.wait([proto.exited], timeout=1.0)  # the leader reaped here
            transport.close()
        raise
    except OSError as exc:
        # Python names the directory when chdir failed and the program otherwise (but
        # not every event loop says which): a directory that fails the check now was
        # what failed, whatever the error names.
        problem = check_cwd(cwd) if cwd else None
        if problem is not None:
            return Outcome(JobState.FAILED, -1, problem)
        if cwd and exc.filename == cwd:
            text = procs.os_error_text("chdir", cwd, exc)
        else:
            text = procs.os_error_text("exec", executable, exc)
        return Outcome(JobState.FAILED, -1, f"start: {text}")
    except (ValueError, subprocess.SubprocessError) as exc:
        return Outcome(JobState.FAILED, -1, f"start: {exc}")
    return Started(transport.get_pid(), transport, proto, clock.monotonic())


async def supervise(
    proc: Started,
    *,
    on_output: OutputSink,
    cancel: asyncio.Event,
    clock: Clock,
    timings: Timings = DEFAULT,
    max_runtime_seconds: float = 0.0,
    idle_timeout: float = 0.0,
    output_grace: float | None = None,
    hangup: asyncio.Future[str] | None = None,
) -> Outcome:
    """Watch a started process until it is complete; never raises for the job's sake.

    Output goes to ``on_output`` as it is read. ``cancel`` set at any time starts the
    cancellation path; ``max_runtime_seconds`` and ``idle_timeout`` are in seconds,
    zero or less disabling the watchdog. If this task is itself torn down,
    the group is SIGKILLed on the way out.

    ``output_grace`` is for a terminal: the job is complete when
    its leader exited, whoever still holds the terminal, and the output then gets at
    most that long to drain. Without it, complete means exited *and* output at its end.

    ``hangup`` resolving (an attached job's relay ended: its client is gone) starts the
    cancellation path too, with the future's result as the reason.
    """
    activity = proc.activity
    pump = asyncio.create_task(_pump(proc.proto.output, on_output, activity, clock), name="pump")
    on_exit = output_grace is not None
    try:
        trip = await _watch(
            None if on_exit else pump,
            proc.proto.exited,
            cancel,
            clock,
            proc.at,
            activity,
            max_runtime_seconds,
            idle_timeout,
            timings.watchdog_period,
            hangup,
        )
        if trip is None:
            outcome = await _after_exit(proc.target, proc.transport.get_returncode())
        else:
            outcome = await _cancel(proc, None if on_exit else pump, trip, timings.kill_grace)
        if output_grace is not None and not pump.done():
            await asyncio.wait([pump], timeout=output_grace)  # The last screen
        return outcome
    except BaseException:
        # Our own task is being torn down (abandoned at shutdown): never leave the
        # group running unsupervised.
        procs.kill_group_now(proc.target)
        raise
    finally:
        if not pump.done():
            pump.cancel()
        proc.transport.close()


async def _watch(
    pump: asyncio.Task[None] | None,
    exited: asyncio.Future[None],
    cancel: asyncio.Event,
    clock: Clock,
    started: float,
    activity: _Activity,
    max_runtime_seconds: float,
    idle_timeout: float,
    period: float,
    hangup: asyncio.Future[str] | None = None,
) -> str | None:
    """Wait for completion; return ``None`` then, else the reason supervision must step in."""
    cancelled = asyncio.create_task(cancel.wait(), name="cancel-wait")
    try:
        while True:
            if (pump is None or pump.done()) and exited.done():
                return None
            if cancel.is_set():
                return REASON_CANCELLED
            if hangup is not None and hangup.done() and not hangup.cancelled():
                return hangup.result()
            now = clock.monotonic()
            # Max runtime wins when both are due in the same check.
            if max_runtime_seconds > 0 and now - started > max_runtime_seconds:
                return f"max_runtime exceeded ({durations.render_duration(max_runtime_seconds)})"
            if idle_timeout > 0 and now - activity.last > idle_timeout:
                return f"idle: no output for {durations.render_duration(idle_timeout)}"
            waitables = [
                f for f in (pump, exited, cancelled, hangup) if f is not None and not f.done()
            ]
            await asyncio.wait(waitables, timeout=period, return_when=asyncio.FIRST_COMPLETED)
    finally:
        cancelled.cancel()


async def _cancel(
    proc: Started, pump: asyncio.Task[None] | None, trip: str, grace: float
) -> Outcome:
    """The cancellation path for a process that is not complete yet.

    ``pump`` is ``None`` when completion does not wait for the output (a terminal).
    """
    exited = proc.proto.exited
    finished = (exited,) if pump is None else (pump, exited)
    teardown = await procs.escalate(proc.target, finished, exited, grace=grace)
    # Completion still needs the pipe's end: an escapee holding it keeps the job
    # running even now (WRK-123, base behaviour).
    if pump is not None:
        await pump
    returncode = proc.transport.get_returncode()
    if teardown.term_delivered or teardown.stragglers:
        reason = REASON_SURVIVORS if teardown.survivors else REASON_CANCELLED
        outcome = Outcome(JobState.KILLED, exit_code_of(returncode), reason)
    else:
        # It ended on its own in the same instant: the real outcome stands.
        outcome = _plain_outcome(returncode)
    if trip != REASON_CANCELLED:
        outcome = Outcome(JobState.KILLED, outcome.exit_code, trip)
    return outcome


async def run_job(
    assignment: wire.Assignment,
    *,
    on_output: OutputSink,
    cancel: asyncio.Event,
    clock: Clock,
    base_env: Mapping[str, str] | None = None,
    timings: Timings = DEFAULT,
    mig_uuids: Mapping[str, str] | None = None,
) -> Outcome:
    """``start_job`` then ``supervise_job``: one assignment from spawn to outcome."""
    started = await start_job(assignment, clock=clock, base_env=base_env, mig_uuids=mig_uuids)
    if isinstance(started, Outcome):
        return started
    return await supervise_job(
        assignment, started, on_output=on_output, cancel=cancel, clock=clock, timings=timings
    )


async def start_job(
    assignment: wire.Assignment,
    *,
    clock: Clock,
    base_env: Mapping[str, str] | None = None,
    mig_uuids: Mapping[str, str] | None = None,
) -> Started | Outcome:
    """Start one assignment in logs mode (§7.4): its environment, its command, the spawn.

    Attached modes (``tty``, ``pipe``) go through ``attached`` instead, which opens the
    relay streams first. ``mig_uuids``: ``build_env``'s.
    """
    env = build_env(assignment, os.environ if base_env is None else base_env, mig_uuids)
    return await start(job_argv(assignment), env=env, cwd=assignment.cwd or None, clock=clock)


async def supervise_job(
    assignment: wire.Assignment,
    started: Started,
    *,
    on_output: OutputSink,
    cancel: asyncio.Event,
    clock: Clock,
    timings: Timings = DEFAULT,
) -> Outcome:
    """Supervise a started assignment under its own watchdogs."""
    return await supervise(
        started,
        on_output=on_output,
        cancel=cancel,
        clock=clock,
        timings=timings,
        max_runtime_seconds=float(assignment.max_runtime_seconds or 0),
        idle_timeout=float(assignment.idle_timeout_seconds or 0),
    )
