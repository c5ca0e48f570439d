"""Terminal input frames applied to a real PTY (WTTY-005), without a controller."""

from __future__ import annotations

import asyncio
import base64
import fcntl
import json
import os
import struct
import termios
import tty as stdtty
from collections.abc import Awaitable, Callable, Iterator

import pytest

from resource_controller.worker import tty


@pytest.fixture
def pty_pair() -> Iterator[tuple[tty.Terminal, int]]:
    master, slave = os.openpty()
    stdtty.setraw(slave)  # read what arrives, byte for byte
    term = tty.Terminal(master)
    try:
        yield term, slave
    finally:
        term.close()
        os.close(slave)


def run(fn: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(10):
            await fn()

    asyncio.run(bounded())


def size_of(fd: int) -> tuple[int, int]:
    rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    return rows, cols


def frame(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def test_a_data_frame_is_written_to_the_terminal_byte_exact(
    pty_pair: tuple[tty.Terminal, int],
) -> None:
    term, slave = pty_pair
    payload = bytes(range(1, 128))

    async def go() -> None:
        await tty.apply_frame(frame(t="d", b=base64.b64encode(payload).decode()), term)

    run(go)
    got = b""
    while len(got) < len(payload):
        got += os.read(slave, 4096)
    assert got == payload


def test_a_resize_sets_the_window_and_a_zero_dimension_is_ignored(
    pty_pair: tuple[tty.Terminal, int],
) -> None:
    term, slave = pty_pair

    async def go() -> None:
        await tty.apply_frame(frame(t="r", rows=40, cols=120), term)
        await tty.apply_frame(frame(t="r", rows=0, cols=99), term)  # never 0xN
        await tty.apply_frame(b"   ", term)  # blank: skipped
        await tty.apply_frame(frame(t="zz", rows=1), term)  # unknown type: skipped

    run(go)
    assert size_of(slave) == (40, 120)


@pytest.mark.parametrize(
    "line",
    [
        b"{not json",
        b"[1, 2]",
        frame(t="d", b="***"),
        frame(t="d", b=5),
        frame(t="r", rows=70000, cols=80),
        frame(t="r", rows=True, cols=80),
        frame(t="r", rows=-1, cols=80),
    ],
)
def test_a_malformed_frame_ends_input(line: bytes, pty_pair: tuple[tty.Terminal, int]) -> None:
    term, _ = pty_pair

    async def go() -> None:
        with pytest.raises(tty.InputEnded):
            await tty.apply_frame(line, term)

    run(go)


def test_the_default_window_is_24_by_80() -> None:
    master, slave = os.openpty()
    try:
        tty.set_size(master, tty.DEFAULT_ROWS, tty.DEFAULT_COLS)
        assert size_of(slave) == (24, 80)
    finally:
        os.close(master)
        os.close(slave)
