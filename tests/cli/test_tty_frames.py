"""``rc run --tty``'s keystrokes: stdin read into data frames of at most 4096 bytes
(CLI-199), written to a real relay stream over a socket pair."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket

import h11

from resource_controller.cli import tty
from resource_controller.h1 import aio


def chunks(sent: bytes) -> list[bytes]:
    """The chunks of a request's chunked body, as h11's server side reads them."""
    server = h11.Connection(h11.SERVER)
    server.receive_data(sent)
    out: list[bytes] = []
    piece = b""
    while not isinstance(event := server.next_event(), h11.EndOfMessage):
        assert event is not h11.NEED_DATA, "the body did not end"
        if isinstance(event, h11.Data):
            piece += event.data
            if event.chunk_end:
                out.append(piece)
                piece = b""
    return out


async def send_keys(data: bytes) -> bytes:
    """Feed ``data`` through a pipe to ``rc``'s stdin reader; what reached the relay."""
    ours, theirs = socket.socketpair()
    read_fd, write_fd = os.pipe()
    # The relay's answer is there before the request: the stream opens at once.
    ours.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")

    async def connect(*_: object) -> aio.Streams:
        return await asyncio.open_connection(sock=theirs)

    try:
        stream = await aio.relay("http://relay.test", "POST", "/in", "t", connect=connect)
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
