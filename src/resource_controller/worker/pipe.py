"""Pipe mode (CP-001, CP-002): raw stdin and stdout through the relay, no terminal.

Byte-exact both ways, since a PTY's line discipline would rewrite a tar stream. Stdin is
fed by a task of its own that the job's completion never waits for (``tar -cf -`` never
reads stdin and exits at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess

from resource_controller import errors, wire
from resource_controller.clock import Clock
from resource_controller.h1 import aio
from resource_controller.worker import runner
from resource_controller.worker.timings import Timings

PIPES = (subprocess.PIPE, subprocess.PIPE, subprocess.PIPE)


async def feed_stdin(inp: aio.Exchange, started: runner.Started) -> None:
    """Copy the input stream into the process's stdin until either ends; the input's end
    closes stdin. A write error is not reported: the process chose not to read."""
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


async def run(
    assignment: wire.Assignment,
    argv: list[str],
    env: dict[str, str],
    inp: aio.Exchange,
    *,
    sink: runner.OutputSink,
    on_log: runner.OutputSink,
    cancel: asyncio.Event,
    clock: Clock,
    timings: Timings,
    hangup: asyncio.Future[str],
) -> runner.Outcome:
    """Spawn with three pipes: stdout to ``sink``, stderr to the log (``on_log``)."""
    started = await runner.start(
        argv, env=env, cwd=assignment.cwd or None, clock=clock, stdio=PIPES
    )
    if isinstance(started, runner.Outcome):
        return started
    assert started.proto.errors is not None
    feeder = asyncio.create_task(feed_stdin(inp, started))
    stderr = asyncio.create_task(runner.copy_output(started.proto.errors, on_log, started, clock))
    try:
        outcome = await runner.supervise_job(
            assignment,
            started,
            on_output=sink,
            cancel=cancel,
            clock=clock,
            timings=timings,
            hangup=hangup,
        )
        # The process is gone: its stderr ends now, unless an escapee still holds it.
        await asyncio.wait([stderr], timeout=timings.pty_drain)
        return outcome
    finally:
        for task in (feeder, stderr):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
