"""``rc run --tty``: this terminal, raw, attached to the job's terminal.

The terminal is restored before anything else is printed, on every way out.
``JobWatch`` ends a session no worker will join: a job can end before its halves attach.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import json
import os
import signal
import struct
import sys
import termios
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from resource_controller import errors
from resource_controller.cli import common, signals
from resource_controller.client import api
from resource_controller.core.states import TERMINAL
from resource_controller.h1 import aio

FRAME_BYTES = 4096
#: What ``--tty`` without a command runs: the box's bash, else its sh.
DEFAULT_SHELL = ["/bin/sh", "-c", "exec $(command -v bash || command -v sh) -i"]
#: Signals that end the session and detach (the terminal being raw, Ctrl-C is not one).
DETACHING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
NOT_A_TERMINAL = "--tty needs a terminal on stdin: run rc from a shell, or drop --tty"


class NotATerminal(common.Failure):
    """Stdin is not a terminal."""


class SessionError(Exception):
    """The relay failed; the message names the half and the cause."""


def window_size(fd: int) -> tuple[int, int]:
    """(rows, cols) of the terminal on ``fd``; zeros when unknown."""
    try:
        rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    except OSError:
        return 0, 0
    return rows, cols


def data_frame(data: bytes) -> bytes:
    """TTY-031 data frame, one line."""
    return b'{"t":"d","b":"' + base64.b64encode(data) + b'"}\n'


def resize_frame(rows: int, cols: int) -> bytes:
    """TTY-031 resize frame, one line."""
    frame = json.dumps({"t": "r", "rows": rows, "cols": cols}, separators=(",", ":"))
    return frame.encode() + b"\n"


#: How often an attached client asks whether its job ended without its session.
JOB_CHECK_EVERY = 1.0
#: Once the job is over, how long its session's last bytes get to arrive.
LAST_BYTES_GRACE = 2.0


class JobWatch:
    """The worker closes its halves before reporting the end, so a terminal job has sent all."""

    def __init__(self, base: str, token: str, job_id: str, on_end: Callable[[], None]) -> None:
        self.path = f"/v1/jobs/{job_id}"
        self.base = base
        self.token = token
        self.on_end = on_end
        #: Set once the watch ended the session.
        self.ended = False

    async def run(self) -> None:
        while not await self._terminal():
            await asyncio.sleep(JOB_CHECK_EVERY)
        await asyncio.sleep(LAST_BYTES_GRACE)
        self.ended = True
        self.on_end()

    async def _terminal(self) -> bool:
        try:
            stream = await aio.relay(self.base, "GET", self.path, self.token, timeout=10.0)
        except errors.TransportError:
            return False  # asked again at the next check
        try:
            async with asyncio.timeout(10.0):
                body = await stream.read_all(None)
            state = (json.loads(body).get("job") or {}).get("state")
        except (errors.TransportError, TimeoutError, ValueError, AttributeError):
            return False
        finally:
            stream.close()
        return state in TERMINAL


@dataclass
class SessionState:
    """What happened during the session, read once the terminal is restored."""

    signum: int = 0
    error: str = ""
    stop: asyncio.Event = field(default_factory=asyncio.Event)


def attach(client: api.JsonClient, job_id: str) -> None:
    """``NotATerminal`` is raised before touching anything."""
    in_fd, out_fd = sys.stdin.fileno(), sys.stdout.fileno()
    if not os.isatty(in_fd):
        raise NotATerminal(NOT_A_TERMINAL)
    base, token = client.relay_target()
    sys.stdout.flush()
    saved = termios.tcgetattr(in_fd)
    try:
        import tty

        tty.setraw(in_fd, termios.TCSANOW)
        state = asyncio.run(_session(base, token, job_id, in_fd, out_fd))
    finally:
        # First thing on every way out, before any other line.
        try:
            termios.tcsetattr(in_fd, termios.TCSADRAIN, saved)
        except (OSError, termios.error):
            sys.stderr.write("\r\nrc: the terminal could not be restored: run reset\r\n")
            sys.stderr.flush()
    ended(state)


async def _session(base: str, token: str, job_id: str, in_fd: int, out_fd: int) -> SessionState:
    feed = _keys_and_sizes(in_fd)
    return await session(base, token, job_id, out_fd, feed, "terminal", "terminal output")


async def session(
    base: str,
    token: str,
    job_id: str,
    out_fd: int,
    feed: Callable[[aio.Exchange, SessionState], Coroutine[Any, Any, None]],
    what: str,
    output: str,
) -> SessionState:
    """Until the output ends, the job does, or a signal."""
    state = SessionState()
    loop = asyncio.get_running_loop()
    for sig in DETACHING:
        loop.add_signal_handler(sig, on_signal, state, sig)
    try:
        out, inp = await open_halves(base, token, job_id, f"the {{}} half of the {what}")
    except SessionError as exc:
        state.error = str(exc)
        return state
    tasks = [
        asyncio.create_task(copy_output(out, out_fd, state, output)),
        asyncio.create_task(feed(inp, state)),
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


def _keys_and_sizes(fd: int) -> Callable[[aio.Exchange, SessionState], Coroutine[Any, Any, None]]:
    """The terminal's input: its size first and after every SIGWINCH, then its keys."""

    async def feed(inp: aio.Exchange, state: SessionState) -> None:
        loop = asyncio.get_running_loop()
        resized = asyncio.Event()
        loop.add_signal_handler(signal.SIGWINCH, resized.set)
        resizes = asyncio.create_task(_resizes(inp, fd, resized))
        try:
            await _send_size(inp, fd)
            await _send_keys(inp, fd, state)
            await state.stop.wait()  # window changes go on being sent
        finally:
            loop.remove_signal_handler(signal.SIGWINCH)
            resizes.cancel()
            with contextlib.suppress(errors.TransportError):
                await asyncio.wait_for(inp.finish(), 1.0)

    return feed


def ended(state: SessionState) -> None:
    """After a session: raise its signal (``signals.Interrupted``) or its failure."""
    if state.signum:
        signals.restore_defaults()
        raise signals.Interrupted(state.signum)
    signals.install()  # the wait that follows detaches on a signal again
    if state.error:
        raise common.Failure(state.error)


def on_signal(state: SessionState, signum: int) -> None:
    state.signum = state.signum or signum
    state.stop.set()


async def open_halves(
    base: str, token: str, job_id: str, named: str
) -> tuple[aio.Exchange, aio.Exchange]:
    """``named`` is a template for ``output`` or ``input``."""
    path = f"/v1/jobs/{job_id}/tty"
    halves: list[aio.Exchange] = []
    for half, method, tail in (("output", "GET", "out"), ("input", "POST", "in")):
        try:
            halves.append(await aio.relay(base, method, f"{path}/{tail}", token))
        except errors.TransportError as exc:
            for opened in halves:
                opened.close()
            said = exc.describe() if isinstance(exc, errors.Refused) else str(exc)
            raise SessionError(f"cannot open {named.format(half)}: {said}") from None
    return halves[0], halves[1]


async def copy_output(
    out: aio.Exchange, fd: int, state: SessionState, what: str = "terminal output"
) -> None:
    """The job's bytes to ``fd`` as they come; EOF ends the session."""
    try:
        while data := await out.read():
            write_all(fd, data)
    except errors.TransportError as exc:
        state.error = state.error or f"{what} ended: {exc}"
    except OSError as exc:
        state.error = state.error or f"cannot write output: {exc.strerror or exc}"
    finally:
        state.stop.set()


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


async def readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


async def _send_keys(inp: aio.Exchange, fd: int, state: SessionState) -> None:
    """One data frame per read of stdin; stdin's end closes the input half only."""
    try:
        while True:
            await readable(fd)
            try:
                data = os.read(fd, FRAME_BYTES)
            except BlockingIOError:
                continue
            if not data:
                await inp.finish()  # stdin EOF: the job's input ends, the job goes on
                return
            await inp.write(data_frame(data))
    except errors.TransportError:
        return  # input refused or broken: output still decides the session's end
    except OSError as exc:
        state.error = state.error or f"cannot read the terminal: {exc.strerror or exc}"
        state.stop.set()


async def _resizes(inp: aio.Exchange, fd: int, resized: asyncio.Event) -> None:
    """A resize frame after each window change; changes while one is sent make one more."""
    while True:
        await resized.wait()
        resized.clear()
        await _send_size(inp, fd)


async def _send_size(inp: aio.Exchange, fd: int) -> None:
    rows, cols = window_size(fd)
    if rows <= 0 or cols <= 0:
        return  # zero dimensions are never sent
    with contextlib.suppress(errors.TransportError):
        await inp.write(resize_frame(rows, cols))
