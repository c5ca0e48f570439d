"""The worker's own HTTP/1.1 (``worker/transport.py``) against a real socket server."""

from __future__ import annotations

import asyncio

import pytest

from resource_controller.worker import transport


def test_targets_quote_what_a_path_cannot_carry() -> None:
    assert transport.target_of("/v1/devices/box:gpu0/fault") == "/v1/devices/box:gpu0/fault"
    assert transport.target_of("/v1/devices/a b/ü") == "/v1/devices/a%20b/%C3%BC"
    assert transport.target_of("/v1/x", {"wait": "30s"}) == "/v1/x?wait=30s"


def test_a_prefixed_base_chunked_answers_and_one_kept_connection() -> None:
    """The base URL's path prefixes every target; a chunked body is read whole; the
    connection is reused for the next request."""
    lines: list[bytes] = []
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while line := await reader.readline():
            lines.append(line)
            length = 0
            while (header := await reader.readline()) not in (b"\r\n", b""):
                if header.lower().startswith(b"content-length:"):
                    length = int(header.split(b":")[1])
            await reader.readexactly(length)
            writer.write(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Rc: yes\r\n\r\n"
                b'3\r\n{"a\r\n5\r\n": 1}\r\n0\r\n\r\n'
            )
            await writer.drain()
        writer.close()

    async def go() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        plain = transport.Plain({"Authorization": "Bearer t"})
        try:
            base = f"http://127.0.0.1:{port}/rc"
            first = await plain.request("POST", base, "/v1/a", b'{"x":1}')
            second = await plain.request("GET", base, "/v1/b?wait=1s", None)
        finally:
            await plain.aclose()
            server.close()
            await server.wait_closed()
        for answer in (first, second):
            assert answer.is_success and answer.json() == {"a": 1}
            assert answer.headers["x-rc"] == "yes"

    asyncio.run(go())
    assert lines == [b"POST /rc/v1/a HTTP/1.1\r\n", b"GET /rc/v1/b?wait=1s HTTP/1.1\r\n"]
    assert connections == 1


def test_a_refused_connection_is_connect_failed() -> None:
    """Nothing was sent, so another controller may take the request (EXT-PG-5)."""

    async def go() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        plain = transport.Plain({})
        try:
            with pytest.raises(transport.ConnectFailed):
                await plain.request("GET", f"http://127.0.0.1:{port}", "/", None)
        finally:
            await plain.aclose()

    asyncio.run(go())


def test_an_answer_cut_short_is_a_transport_error() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await writer.drain()
        writer.close()

    async def go() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        plain = transport.Plain({})
        try:
            with pytest.raises(transport.TransportError, match="mid-response"):
                await plain.request("GET", f"http://127.0.0.1:{port}", "/", None)
        finally:
            await plain.aclose()
            server.close()
            await server.wait_closed()

    asyncio.run(go())
