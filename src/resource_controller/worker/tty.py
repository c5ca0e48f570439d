"""A job under a pseudo-terminal (WTTY-003..007): the terminal and its input frames.

The child leads a new session on the PTY slave; the worker keeps the master, whose bytes
are the output and to which input frames are written. Resizing the master makes the
kernel send SIGWINCH to the foreground group, as a local terminal would.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import fcntl
import json
import logging
import os
import struct
import termios
from collections.abc import Mapping, Sequence

from resource_controller import errors
from resource_controller.clock import Clock
from resource_controller.core.states import JobState
from resource_controller.h1 import aio
from resource_controller.worker import procs, runner

log = logging.getLogger(__name__)

DEFAULT_ROWS = 24
DEFAULT_COLS = 80
LINE_MAX = 1_048_576
DIMENSION_MAX = 65_535


def set_size(fd: int, rows: int, cols: int) -> None:
    """Set a terminal's window size (the kernel signals its foreground group)."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _take_controlling_terminal() -> None:
    """In the child, after ``setsid``: fd 0 (the slave) becomes the controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class _Feeder(asyncio.Protocol):
    """Feeds the master's bytes into the reader supervision pumps from."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if isinstance(transport, asyncio.ReadTransport):
            self.reader.set_transport(transport)  # a full reader pauses the master

    def data_received(self, data: bytes) -> None:
        self.reader.feed_data(data)

    def eof_received(self) -> bool | None:
        self.reader.feed_eof()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        # EIO once the last slave holder is gone: the normal end.
        if not self.reader.at_eof():
            self.reader.feed_eof()


class Terminal:
    """The worker's side of one job's PTY: the master, its reader and its writer."""

    def __init__(self, master: int) -> None:
        self.master = master
        self._transport: asyncio.ReadTransport | None = None
        self._closed = False

    async def connect(self, reader: asyncio.StreamReader) -> None:
        """Feed ``reader`` from a duplicate: the master's number stays ours until ``close``."""
        loop = asyncio.get_running_loop()
        pipe = os.fdopen(os.dup(self.master), "rb", buffering=0)
        transport, _ = await loop.connect_read_pipe(lambda: _Feeder(reader), pipe)
        self._transport = transport

    async def write(self, data: bytes) -> None:
        """Write all of ``data`` to the master, waiting while the terminal is full."""
        view = memoryview(data)
        while view:
            if self._closed:
                raise OSError("the terminal is closed")
            try:
                view = view[os.write(self.master, view) :]
            except BlockingIOError:
                await self._writable()

    async def _writable(self) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_writer(self.master, wake)
        try:
            await ready
        finally:
            loop.remove_writer(self.master)

    def resize(self, rows: int, cols: int) -> None:
        set_size(self.master, rows, cols)

    def close(self) -> None:
        """Close the master unconditionally; safe to repeat."""
        if self._closed:
            return
        self._closed = True
        if self._transport is not None:
            self._transport.close()
        with contextlib.suppress(OSError):
            os.close(self.master)


async def start(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None, clock: Clock
) -> tuple[runner.Started, Terminal] | runner.Outcome:
    """Spawn ``argv`` under a fresh PTY; a failure is the job's outcome."""
    try:
        master, slave = os.openpty()
    except OSError as exc:
        return runner.Outcome(JobState.FAILED, -1, f"start pty: {exc.strerror or exc}")
    try:
        set_size(master, DEFAULT_ROWS, DEFAULT_COLS)
        started = await runner.start(
            argv,
            env=env,
            cwd=cwd,
            clock=clock,
            stdio=(slave, slave, slave),
            preexec=_take_controlling_terminal,
        )
    except OSError as exc:
        os.close(master)
        return runner.Outcome(JobState.FAILED, -1, f"start pty: {exc.strerror or exc}")
    finally:
        os.close(slave)  # the child has its copies; ours would keep the master from EOF
    if isinstance(started, runner.Outcome):
        os.close(master)
        return started
    started.target = procs.SessionOf(started.pgid)  # the whole session (WTTY-006)
    terminal = Terminal(master)
    await terminal.connect(started.proto.output)
    return started, terminal


class InputEnded(Exception):
    """Input processing ends here; the message is the warning (empty: silently)."""


async def forward_input(stream: aio.Exchange, terminal: Terminal, job_id: str) -> None:
    """Apply the input stream's frames until it ends, which never ends the job (WTTY-005)."""
    try:
        await _frames(stream, terminal)
    except InputEnded as exc:
        if str(exc):
            log.warning(
                "job %s: terminal input ended: %s",
                job_id,
                exc,
                extra={"action": "tty_input_ended", "job_id": job_id},
            )


async def _frames(stream: aio.Exchange, terminal: Terminal) -> None:
    pending = bytearray()
    while True:
        try:
            piece = await stream.read()
        except errors.TransportError as exc:
            raise InputEnded(f"input stream: {exc}") from None
        if not piece:
            return  # end of stream: silently
        pending += piece
        while (end := pending.find(b"\n")) >= 0:
            line = bytes(pending[:end])
            del pending[: end + 1]
            if len(line) > LINE_MAX:
                raise InputEnded(f"a frame line is longer than {LINE_MAX} bytes")
            await apply_frame(line, terminal)
        if len(pending) > LINE_MAX:
            raise InputEnded(f"a frame line is longer than {LINE_MAX} bytes")


def _dimension(frame: dict[str, object], key: str) -> int:
    value = frame.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= DIMENSION_MAX:
        raise InputEnded(f"resize frame: {key} must be an integer in 0..{DIMENSION_MAX}")
    return value


async def apply_frame(line: bytes, terminal: Terminal) -> None:
    """One frame: data is written, a resize applied; anything else is skipped."""
    if not line.strip():
        return
    try:
        frame = json.loads(line)
    except ValueError:
        raise InputEnded("malformed frame: not JSON") from None
    if not isinstance(frame, dict):
        raise InputEnded("malformed frame: not a JSON object")
    kind = frame.get("t")
    if kind == "d":
        text = frame.get("b")
        if not isinstance(text, str):
            raise InputEnded("data frame: b must be a base64 string")
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise InputEnded("data frame: b is not valid base64") from None
        try:
            await terminal.write(data)
        except OSError as exc:
            raise InputEnded(f"write to the terminal: {exc.strerror or exc}") from None
    elif kind == "r":
        rows, cols = _dimension(frame, "rows"), _dimension(frame, "cols")
        if rows == 0 or cols == 0:
            log.warning("terminal resize to %dx%d ignored: a zero dimension", rows, cols)
            return
        try:
            terminal.resize(rows, cols)
        except OSError as exc:
            log.warning("terminal resize to %dx%d failed: %s", rows, cols, exc)
