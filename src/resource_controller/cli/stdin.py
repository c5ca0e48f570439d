"""``rc run -i``: stdin to the job over pipe mode (CP-001); the job's stderr is kept, not shown."""

from __future__ import annotations

import asyncio
import os
import sys

from resource_controller import errors
from resource_controller.cli.tty import SessionState, ended, readable, session
from resource_controller.client import api
from resource_controller.h1 import aio

BLOCK = 65_536


def forward(client: api.JsonClient, job_id: str) -> None:
    """Run the pipe session until the job's output ends; raise on a signal or a failure."""
    base, token = client.relay_target()
    sys.stdout.flush()
    ended(asyncio.run(_session(base, token, job_id, sys.stdin.fileno(), sys.stdout.fileno())))


async def _session(base: str, token: str, job_id: str, in_fd: int, out_fd: int) -> SessionState:
    async def feed(inp: aio.Exchange, _state: SessionState) -> None:
        await _copy_in(inp, in_fd)

    return await session(base, token, job_id, out_fd, feed, "job's stdio", "the job's output")


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
