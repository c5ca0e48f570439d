"""``rc run --tty``'s keystrokes: stdin read into data frames of at most 4096 bytes
(CLI-199), written to a real relay stream over a socket pair."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket

from resource_controller import duplex, http1
from resource_controller.cli import tty


def chunks(body: bytes) -> list[bytes]:
    """The chunks of a chunked request body, up to its last (empty) one."""
    out: list[bytes] = []
    while True:
        line, _, body = body.partition(b"\r\n")
        size = http1.chunk_size(line + b"\r\n")
        if size == 0:
            return out
        out.append(body[:size])
        assert body[size : size + 2] == b"\r\n"
        body = body[size + 2 :]


async def send_keys(data: bytes) -> bytes:
    """Feed ``data`` through a pipe to ``rc``'s stdin reader; what reached the relay."""
    ours, theirs = socket.socketpair()
    read_fd, write_fd = os.pipe()
    try:
        reader, writer = await asyncio.open_connection(sock=theirs)
        stream = duplex.Stream(reader, writer, chunked=True)
        os.write(write_fd, data)  # all of it at once: reads may return more than a frame
        os.close(write_fd)
        write_fd = -1
        state = tty.SessionState()
        await asyncio.wait_for(tty._send_keys(stream, read_fd, state), 10)
        stream.close()
        await stream.wait_closed()
        assert state.error == ""
        ours.settimeout(10)
        body = b""
        while piece := ours.recv(65536):
            body += piece
        return body
    finally:
        ours.close()
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)


def test_stdin_goes_out_in_frames_of_at_most_4096_bytes() -> None:
    typed = bytes(i % 251 for i in range(10_000))
    frames = chunks(asyncio.run(send_keys(typed)))
    payloads = []
    for frame in frames:
        assert frame.endswith(b"\n") and frame.count(b"\n") == 1  # one frame a line
        message = json.loads(frame)
        assert message["t"] == "d"
        payloads.append(base64.b64decode(message["b"]))
    assert tty.FRAME_BYTES == 4096  # CLI-199
    assert all(len(p) <= 4096 for p in payloads), [len(p) for p in payloads]
    assert len(payloads) >= 3
    assert b"".join(payloads) == typed
