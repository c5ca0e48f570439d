"""Starting one job as a process group, supervising it, and saying how it ended (§7-8).

A job is complete once its leader exited **and** its output pipe reached its end; a kill
flag, a shutdown and a watchdog trip all take one cancellation path (WRK-096).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import stat
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from resource_controller import wire
from resource_controller.clock import Clock
from resource_controller.core import durations
from resource_controller.core.cuda import cuda_visible_devices
from resource_controller.core.states import JobState, Kind
from resource_controller.worker import procs
from resource_controller.worker.timings import DEFAULT, Timings

log = logging.getLogger(__name__)

READ_BLOCK = 65_536
#: What a hold runs, whatever the assignment says (WRK-125).
SLEEPER = ("sleep", "2147483647")

REASON_CANCELLED = "cancelled"
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


def device_ids_of(assignment: wire.Assignment) -> tuple[str, ...]:
    """The assignment's devices: its ``device_ids``, or its one ``device_id``."""
    return tuple(assignment.device_ids or [assignment.device_id])


def build_env(
    assignment: wire.Assignment,
    base_env: Mapping[str, str],
    mig_uuids: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The job's environment (WRK-075/076, EXT-GANG-4, EXT-EPOCH-2, EXT-LIVE-1)."""
    job_env = assignment.env or {}
    device_ids = device_ids_of(assignment)
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
    if assignment.kind == Kind.HOLD:
        return list(SLEEPER)
    return list(assignment.command)


def check_cwd(cwd: str) -> str | None:
    """Why the job cannot run in ``cwd``: before the spawn, a failed ``chdir`` in the child
    would read as the program's error."""
    try:
        st = os.stat(cwd)
    except FileNotFoundError:
        return f"cwd {cwd}: no such directory"
    except OSError as exc:
        return procs.os_error_text("cwd", cwd, exc)
    if not stat.S_ISDIR(st.st_mode):
        return f"cwd {cwd}: not a directory"
    if not os.access(cwd, os.X_OK):
        return f"cwd {cwd}: permission denied"
    return None


class _Protocol(asyncio.SubprocessProtocol):
    """Notes the leader's exit apart from the pipes' end, which the cancellation path
    must tell apart (``Process.wait()`` waits for both)."""

    def __init__(self, *, separate_stderr: bool = False) -> None:
        self.output = asyncio.StreamReader(limit=READ_BLOCK)
        self.errors = asyncio.StreamReader(limit=READ_BLOCK) if separate_stderr else None
        self.exited: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        #: Pipe mode's stdin: clear while its buffer is full; set once it closed.
        self.writable = asyncio.Event()
        self.writable.set()
        self.stdin_closed = asyncio.Event()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Duck-typed: uvloop's subprocess transport does not subclass asyncio's.
        get_pipe = getattr(transport, "get_pipe_transport", lambda _fd: None)
        for fd in (1, 2):
            pipe = get_pipe(fd)
            if isinstance(pipe, asyncio.ReadTransport):
                self._reader(fd).set_transport(pipe)  # the reader pauses the pipe when full

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


async def copy_output(
    reader: asyncio.StreamReader, sink: OutputSink, proc: Started, clock: Clock
) -> None:
    """Copy ``reader`` into ``sink`` to its end, noting the time for the idle watchdog."""
    while True:
        try:
            chunk = await reader.read(READ_BLOCK)
        except OSError:
            return  # an I/O error on the pipe ends the output like EOF does
        if not chunk:
            return
        proc.last_output = clock.monotonic()
        try:
            await sink(chunk)
        except Exception:
            # The sink never fails the job, and reading must go on, or the pipe fills
            # and the job blocks on its next write.
            log.exception("output sink failed", extra={"action": "output_sink_failed"})


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


async def _after_exit(target: procs.Target, returncode: int | None) -> Outcome:
    """A finished process's outcome, after reaping what it left behind (WRK-099)."""
    outcome = _plain_outcome(returncode)
    await procs.settle_group(target)
    if procs.group_alive(target):
        emptied = await procs.reap_group(target)
        reason = REASON_STRAGGLERS_REAPED if emptied else REASON_STRAGGLERS_REMAINED
        log.warning(
            "process group %s had live members after the leader exited: %s",
            target,
            reason,
            extra={"action": "stragglers"},
        )
        outcome = Outcome(JobState.KILLED, outcome.exit_code, reason)
    return outcome


@dataclass(eq=False)
class Started:
    """A job's process, spawned and not yet watched."""

    pgid: int
    transport: asyncio.SubprocessTransport
    proto: _Protocol
    #: The spawn on ``clock.monotonic()``: where max runtime and idleness count from.
    at: float
    #: The group (``pgid``), or a ``tty`` job's session.
    target: procs.Target = 0
    last_output: float = 0.0

    def __post_init__(self) -> None:
        self.target = self.target or self.pgid
        self.last_output = self.at


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
    """Spawn ``argv`` in a new session, for ``supervise`` at once; or why not (WRK-100)."""
    if not argv:
        return Outcome(JobState.FAILED, -1, REASON_EMPTY_COMMAND)
    problem = check_cwd(cwd) if cwd else None
    if problem is not None:
        return Outcome(JobState.FAILED, -1, problem)
    name = argv[0]
    executable = name if "/" in name else shutil.which(name, path=env.get("PATH") or os.defpath)
    if executable is None:
        return Outcome(
            JobState.FAILED, -1, f"start: exec {name}: executable file not found in $PATH"
        )
    loop = asyncio.get_running_loop()
    # A stderr pipe beside a stdout pipe has a reader of its own; alone, it is the output.
    proto = _Protocol(separate_stderr=stdio[1] is stdio[2] is subprocess.PIPE)
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
            procs.signal_group(transport.get_pid(), signal.SIGKILL)
            await asyncio.wait([proto.exited], timeout=1.0)  # the leader reaped here
            transport.close()
        raise
    except OSError as exc:
        # A directory failing the check now was what failed, whatever the error names
        # (not every event loop says whether chdir or exec did).
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
    kill_grace: Callable[[], float | None] | None = None,
) -> Outcome:
    """Watch a started process until complete (§8); never raises for the job's sake.
    ``hangup``'s result is a reason to cancel; with ``output_grace`` (a terminal) the job
    is complete when its leader exited; ``kill_grace``: the kill flag's own grace, if any.
    Torn down itself, it SIGKILLs the group."""
    pump = asyncio.create_task(copy_output(proc.proto.output, on_output, proc, clock))
    completes_with = None if output_grace is not None else pump
    try:
        trip = await _watch(
            proc,
            completes_with,
            cancel,
            clock,
            max_runtime_seconds,
            idle_timeout,
            timings.watchdog_period,
            hangup,
        )
        if trip is None:
            outcome = await _after_exit(proc.target, proc.transport.get_returncode())
        else:
            own = kill_grace() if kill_grace is not None and trip == REASON_CANCELLED else None
            grace = timings.kill_grace if own is None else own
            outcome = await _cancel(proc, completes_with, trip, grace)
        if output_grace is not None and not pump.done():
            await asyncio.wait([pump], timeout=output_grace)  # the last screen
        return outcome
    except BaseException:
        # Our own task is torn down (abandoned at shutdown): never leave the group
        # running unsupervised.
        procs.signal_group(proc.target, signal.SIGKILL)
        raise
    finally:
        if not pump.done():
            pump.cancel()
        proc.transport.close()


async def _watch(
    proc: Started,
    pump: asyncio.Task[None] | None,
    cancel: asyncio.Event,
    clock: Clock,
    max_runtime_seconds: float,
    idle_timeout: float,
    period: float,
    hangup: asyncio.Future[str] | None,
) -> str | None:
    """Wait for completion: ``None`` then, else why supervision must step in (WRK-094)."""
    exited = proc.proto.exited
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
            if max_runtime_seconds > 0 and now - proc.at > max_runtime_seconds:
                return f"max_runtime exceeded ({durations.render_duration(max_runtime_seconds)})"
            if idle_timeout > 0 and now - proc.last_output > idle_timeout:
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
    """The cancellation path (WRK-096); ``pump`` ``None``: completion ignores the output."""
    exited = proc.proto.exited
    finished = (exited,) if pump is None else (pump, exited)
    teardown = await procs.escalate(proc.target, finished, exited, grace=grace)
    # Completion still needs the pipe's end: an escapee holding it keeps the job
    # running even now (WRK-123).
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


async def start_job(
    assignment: wire.Assignment,
    *,
    clock: Clock,
    base_env: Mapping[str, str],
    mig_uuids: Mapping[str, str] | None = None,
) -> Started | Outcome:
    """Start one assignment in logs mode (§7.4)."""
    env = build_env(assignment, base_env, mig_uuids)
    return await start(job_argv(assignment), env=env, cwd=assignment.cwd or None, clock=clock)


async def supervise_job(assignment: wire.Assignment, started: Started, **how: Any) -> Outcome:
    """``supervise`` under the assignment's own watchdogs; ``how``: its other arguments."""
    return await supervise(
        started,
        max_runtime_seconds=float(assignment.max_runtime_seconds or 0),
        idle_timeout=float(assignment.idle_timeout_seconds or 0),
        **how,
    )
