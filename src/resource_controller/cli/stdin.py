"""``rc run -i``: this process's stdin to the job, over pipe mode (CP-001, like ``docker run -i``).

Without ``-i`` a job's stdin is ``/dev/null`` and ``rc`` never reads its own. With it
the job runs with ``stdio: "pipe"``: the relay's input half carries stdin raw, its end
being the job's stdin EOF, and the output half the job's stdout, raw, to ``rc``'s
stdout. In pipe mode the job's stderr is kept by the worker, not shown.

A signal to ``rc`` ends the session and surfaces as ``signals.Interrupted``, so
``rc run`` detaches as from a log stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys

from resource_controller import errors
from resource_controller.cli import common, signals
from resource_controller.cli.tty import (
    JobWatch,
    SessionError,
    SessionState,
    copy_output,
    on_signal,
    open_half,
    readable,
)
from resource_controller.client import api
from resource_controller.h1 import aio

#: Bytes per read of stdin.
BLOCK = 65_536
DETACHING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def forward(client: api.JsonClient, job_id: str) -> None:
    """Run the pipe session until the job's output ends; raise on a signal or a failure."""
    base, token = client.relay_target()
    sys.stdout.flush()
    state = asyncio.run(_session(base, token, job_id, sys.stdin.fileno(), sys.stdout.fileno()))
    if state.signum:
        signals.restore_defaults()
        raise signals.Interrupted(state.signum)
    signals.install()  # the wait that follows detaches on a signal again
    if state.error:
        raise common.Failure(state.error)


async def _session(base: str, token: str, job_id: str, in_fd: int, out_fd: int) -> SessionState:
    state = SessionState()
    loop = asyncio.get_running_loop()
    for sig in DETACHING:
        loop.add_signal_handler(sig, on_signal, state, sig)
    path = f"/v1/jobs/{job_id}/tty"
    try:
        out = await open_half(base, "GET", f"{path}/out", token, "output", "job's stdio")
        try:
            inp = await open_half(base, "POST", f"{path}/in", token, "input", "job's stdio")
        except SessionError:
            out.close()
            raise
    except SessionError as exc:
        state.error = str(exc)
        return state
    tasks = [
        asyncio.create_task(copy_output(out, out_fd, state, "the job's output")),
        asyncio.create_task(_copy_in(inp, in_fd)),
        asyncio.create_task(JobWatch(base, token, job_id, state.stop.set).run()),
    ]
    try:
        await state.stop.wait()
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        out.close()
        inp.close()
    return state


async def _read(fd: int, pollable: bool) -> bytes:
    if pollable:
        await readable(fd)
        return os.read(fd, BLOCK)
    return await asyncio.to_thread(os.read, fd, BLOCK)  # a regular file never blocks long


async def _copy_in(inp: aio.Exchange, fd: int) -> None:
    """Stdin, raw, until its end, which closes the input half (the job's stdin EOF)."""
    pollable = True
    try:
        loop = asyncio.get_running_loop()
        loop.add_reader(fd, lambda: None)
        loop.remove_reader(fd)
    except (OSError, ValueError):
        pollable = False  # a regular file: epoll refuses it
    try:
        while data := await _read(fd, pollable):
            await inp.write(data)
        await inp.finish()
    except (errors.TransportError, OSError):
        return  # input refused or unreadable: the output still ends the session
