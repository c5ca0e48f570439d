"""An attached job (``stdio`` ``tty`` or ``pipe``): its relay streams around its run.

Both streams must answer ``200`` before the process starts, output first (WTTY-001).
The controller answers the output half only once the session is over, so an answer
while the job runs means nobody can see or type into it again: the job is then
cancelled, ``killed`` with that reason, and never holds its device for a client that
is gone. A ``tty`` job runs on a terminal (``tty``), a ``pipe`` job on three pipes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
from collections.abc import Mapping

from resource_controller import errors, wire
from resource_controller.clock import Clock
from resource_controller.core.states import JobState, Stdio
from resource_controller.h1 import aio
from resource_controller.worker import channel, runner, tty
from resource_controller.worker.timings import Timings

log = logging.getLogger(__name__)

ATTACHED = frozenset({Stdio.TTY.value, Stdio.PIPE.value})
PIPES = (subprocess.PIPE, subprocess.PIPE, subprocess.PIPE)
ANSWER_WAIT = 10.0
REASON_CLIENT_LEFT = "client left"


def is_attached(assignment: wire.Assignment) -> bool:
    return (assignment.stdio or "") in ATTACHED


async def session_over(output: aio.Exchange) -> str:
    """Returns once the controller ended the output half: why the session is over."""
    try:
        while await output.read():
            pass
    except errors.TransportError as exc:
        return f"relay lost: {exc}"
    return REASON_CLIENT_LEFT


async def hang_up(output: aio.Exchange, over: asyncio.Task[str], wait: float = ANSWER_WAIT) -> None:
    """End the output body, then wait (bounded) for the relay's answer: a server may drop
    what it has not read yet when the sender hangs up first."""
    with contextlib.suppress(errors.TransportError):
        await output.finish()
    await asyncio.wait([over], timeout=wait)
    over.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await over
    output.close()


class RelaySink:
    """The job's output into the relay (WTTY-002); a broken stream is logged once."""

    def __init__(self, stream: aio.Exchange, job_id: str) -> None:
        self.stream = stream
        self.job_id = job_id
        self.broken = False

    async def write(self, data: bytes) -> None:
        if self.broken:
            return
        try:
            await self.stream.write(data)
        except errors.TransportError as exc:
            self.broken = True
            log.warning(
                "job %s: relay output stream broke: %s",
                self.job_id,
                exc,
                extra={"action": "relay_output_broken", "job_id": self.job_id},
            )


async def run(
    assignment: wire.Assignment,
    *,
    to_controller: channel.Channel,
    on_log: runner.OutputSink,
    cancel: asyncio.Event,
    clock: Clock,
    timings: Timings,
    base_env: Mapping[str, str],
    mig_uuids: Mapping[str, str] | None = None,
) -> runner.Outcome:
    """Open the relay, run the job in its mode, close the relay: the job's outcome."""
    mode = assignment.stdio or ""
    job_id = assignment.job_id
    try:
        output = await to_controller.relay_output(job_id)
    except errors.TransportError as exc:
        return _attach_failed(mode, "output", exc)
    try:
        inp = await to_controller.relay_input(job_id)
    except errors.TransportError as exc:
        output.close()
        return _attach_failed(mode, "input", exc)
    over = asyncio.create_task(session_over(output), name=f"relay-over-{job_id}")
    try:
        env = runner.build_env(assignment, base_env, mig_uuids)
        argv = runner.job_argv(assignment)
        cwd = assignment.cwd or None
        terminal: tty.Terminal | None = None
        if mode == Stdio.TTY.value:
            got = await tty.start(argv, env=env, cwd=cwd, clock=clock)
            if isinstance(got, runner.Outcome):
                return got
            started, terminal = got
            helpers = [asyncio.create_task(tty.forward_input(inp, terminal, job_id))]
        else:
            # Pipe mode (CP-001, CP-002): byte-exact both ways, which a PTY's line
            # discipline would not be; stdout to the relay, stderr to the log.
            piped = await runner.start(argv, env=env, cwd=cwd, clock=clock, stdio=PIPES)
            if isinstance(piped, runner.Outcome):
                return piped
            started = piped
            assert started.proto.errors is not None
            helpers = [
                asyncio.create_task(
                    runner.copy_output(started.proto.errors, on_log, started, clock)
                ),
                # Never waited for: ``tar -cf -`` never reads stdin and exits at once.
                asyncio.create_task(feed_stdin(inp, started)),
            ]
        try:
            outcome = await runner.supervise_job(
                assignment,
                started,
                on_output=RelaySink(output, job_id).write,
                cancel=cancel,
                clock=clock,
                timings=timings,
                # A terminal's job is complete when its leader exits (WTTY-007).
                output_grace=timings.pty_drain if terminal is not None else None,
                hangup=over,
            )
            if terminal is None:
                # The process is gone: its stderr ends now, unless an escapee holds it.
                await asyncio.wait(helpers[:1], timeout=timings.pty_drain)
            return outcome
        finally:
            for task in helpers:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if terminal is not None:
                terminal.close()
    finally:
        await hang_up(output, over)
        inp.close()


def _attach_failed(mode: str, which: str, exc: errors.TransportError) -> runner.Outcome:
    return runner.Outcome(JobState.FAILED, -1, f"attach {mode} stdio: open {which} stream: {exc}")


async def feed_stdin(inp: aio.Exchange, started: runner.Started) -> None:
    """Copy the input stream into stdin until either ends; a write error is not reported."""
    proto = started.proto
    stdin = started.transport.get_pipe_transport(0)
    if not isinstance(stdin, asyncio.WriteTransport):
        return
    try:
        while not proto.stdin_closed.is_set():
            read = asyncio.create_task(inp.read())
            closed = asyncio.create_task(proto.stdin_closed.wait())
            await asyncio.wait({read, closed}, return_when=asyncio.FIRST_COMPLETED)
            closed.cancel()
            if not read.done():
                read.cancel()
                with contextlib.suppress(asyncio.CancelledError, errors.TransportError):
                    await read
                return
            data = read.result()
            if not data:
                return  # the client closed its input: stdin EOF
            stdin.write(data)
            await proto.writable.wait()
    except (errors.TransportError, OSError, RuntimeError):
        return
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            stdin.close()
