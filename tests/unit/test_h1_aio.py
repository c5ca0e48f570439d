"""The asyncio shell of ``h1`` (the worker, the asynchronous client, webhooks) against a
real socket server on loopback.

Each test's server is an ``asyncio`` server that answers every request with bytes the
test chose, so framings a FastAPI controller rarely sends (chunked, close-delimited,
an interim 100) and misbehaviours (a close mid-body, a garbled status line) are real
bytes on a real connection. The same transport serves every live-controller test.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest

from resource_controller import errors
from resource_controller.h1 import aio, core

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on a fresh loop, never for longer than 30 s."""
    return asyncio.run(asyncio.wait_for(coro, 30.0))


#: Turns one received request (head and body) into the bytes sent back, or ``None``
#: to close the connection without answering.
Answer = Callable[[bytes, bytes], bytes | None]


class Server:
    """Loopback server: records requests and connections, answers with ``answer``."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[tuple[bytes, bytes]] = []
        self.connections = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        for w in self.writers:
            w.close()
        self.server.close()
        await self.server.wait_closed()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                self.requests.append((head, body))
                out = self.answer(head, body)
                if out is None:
                    break
                writer.write(out)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def fixed(raw: bytes) -> Answer:
    return lambda head, body: raw


OK_JSON = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\nRc-Controller-Instance: i-1\r\n\r\n{"a": true}'


class Client(aio.HttpClient):
    """``aio.HttpClient`` taking URLs, as the tests write them."""

    async def get(self, url: str, *, timeout: float = 10.0) -> aio.Answer:
        return await self.call("GET", url, timeout=timeout)

    async def call(
        self, method: str, url: str, body: bytes | None = None, *, timeout: float = 10.0
    ) -> aio.Answer:
        end, target = where(url)
        return await self.request(method, end, target, body, timeout=timeout)

    async def stream(self, url: str) -> aio.Exchange:
        end, target = where(url)
        return await self.open("GET", end, target, timeout=10.0)


def where(url: str) -> tuple[core.Endpoint, str]:
    scheme, _, after = url.partition("://")
    host, slash, path = after.partition("/")
    return core.endpoint(f"{scheme}://{host}"), slash + path


def exchange(answer: Answer, go: Callable[[Client, Server], Awaitable[None]]) -> Server:
    async def main() -> Server:
        async with Server(answer) as server:
            client = Client({"Authorization": "Bearer t"})
            try:
                await go(client, server)
            finally:
                await client.aclose()
            return server

    return run(main())


def test_a_json_post_and_its_answer() -> None:
    async def go(client: Client, server: Server) -> None:
        sent = json.dumps({"state": "running"}).encode()
        resp = await client.call("POST", server.url + "/v1/jobs/j1/status?x=1", sent)
        assert resp.status_code == 200 and resp.reason_phrase == "OK"
        assert resp.json() == {"a": True}
        assert resp.headers["rc-controller-instance"] == "i-1"

    server = exchange(fixed(OK_JSON), go)
    ((head, body),) = server.requests
    assert head.startswith(b"POST /v1/jobs/j1/status?x=1 HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer t\r\n" in head
    assert b"\r\nHost: 127.0.0.1:" in head
    assert json.loads(body) == {"state": "running"}


def test_idle_connections_are_reused_and_concurrent_requests_get_their_own() -> None:
    async def go(client: Client, server: Server) -> None:
        for _ in range(5):
            assert (await client.get(server.url + "/a")).status_code == 200
        assert server.connections == 1
        answers = await asyncio.gather(*(client.get(server.url + "/b") for _ in range(3)))
        assert [r.status_code for r in answers] == [200] * 3
        assert server.connections == 3

    exchange(fixed(OK_JSON), go)


def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    async def go(client: Client, server: Server) -> None:
        assert (await client.get(server.url + "/a")).status_code == 200
        for w in server.writers:
            w.close()  # the server's keep-alive timeout, say
        await asyncio.sleep(0.05)
        assert (await client.get(server.url + "/a")).status_code == 200
        assert server.connections == 2

    exchange(fixed(OK_JSON), go)


@pytest.mark.parametrize(
    ("raw", "content", "reused"),
    [
        (b"HTTP/1.1 204 No Content\r\n\r\n", b"", True),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nT: 1\r\n\r\n",
            b"abcde",
            True,
        ),
        (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            b"ok",
            True,
        ),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", b"ok", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", b"ok", False),
    ],
    ids=["204", "chunked", "interim-100", "connection-close", "http-1.0"],
)
def test_framings(raw: bytes, content: bytes, reused: bool) -> None:
    async def go(client: Client, server: Server) -> None:
        for _ in range(2):
            resp = await client.get(server.url + "/x")
            assert resp.content == content
        assert server.connections == (1 if reused else 2)

    exchange(fixed(raw), go)


async def once_then_close(raw: bytes, path: str = "/x") -> aio.Answer:
    """GET from a server that reads the request, writes ``raw`` and hangs up."""

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        w.write(raw)
        await w.drain()
        w.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        client = Client()
        try:
            return await client.get(f"http://127.0.0.1:{port}{path}")
        finally:
            await client.aclose()
    finally:
        server.close()
        await server.wait_closed()


def test_an_answer_delimited_by_the_end_of_the_connection() -> None:
    resp = run(once_then_close(b"HTTP/1.1 200 OK\r\n\r\nall of it"))
    assert resp.status_code == 200 and resp.content == b"all of it"


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"garbage\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Le",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
    ids=[
        "no-answer",
        "bad-status-line",
        "short-body",
        "bad-length",
        "bad-header",
        "cut-headers",
        "bad-chunk",
    ],
)
def test_a_broken_answer_is_a_transport_error(raw: bytes) -> None:
    kind = errors.Disconnected if not raw else errors.AnswerLost
    with pytest.raises(kind):
        run(once_then_close(raw))


def test_a_refused_connection_is_connect_failed() -> None:
    """Nothing was sent, so another controller may take the request (EXT-PG-5)."""

    async def go(client: Client, server: Server) -> None:
        port = server.port
        server.server.close()
        await server.server.wait_closed()
        with pytest.raises(errors.ConnectFailed, match="connect call failed"):
            await client.get(f"http://127.0.0.1:{port}/x")

    exchange(fixed(OK_JSON), go)


def test_a_cancelled_request_never_leaves_its_connection_for_reuse() -> None:
    def slow_first(head: bytes, body: bytes) -> bytes | None:
        return OK_JSON if b"/fast" in head else b""  # /slow gets no answer at all

    async def go(client: Client, server: Server) -> None:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await client.get(server.url + "/slow")
        assert (await client.get(server.url + "/fast")).status_code == 200
        assert server.connections == 2  # the interrupted one was closed, not reused

    exchange(slow_first, go)


def test_a_chunked_body_streams_as_it_arrives_and_its_connection_is_reused_after() -> None:
    """A log follow: the first piece is read before the server has written the second."""
    second = asyncio.Event()
    connections = 0

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                if b"/follow" in head:
                    w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
                    await w.drain()
                    await second.wait()
                    w.write(b"6\r\nsecond\r\n0\r\n\r\n")
                else:
                    w.write(OK_JSON)
                await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            w.close()

    async def main() -> list[bytes]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        pieces: list[bytes] = []
        try:
            client = Client()
            resp = await client.stream(url + "/follow")
            while piece := await resp.read(10.0):
                pieces.append(piece)
                second.set()
            assert (await client.get(url + "/after")).json() == {"a": True}
            await client.aclose()
        finally:
            server.close()
            await server.wait_closed()
        return pieces

    assert run(main()) == [b"first", b"second"]
    assert connections == 1


def test_a_stream_closed_before_its_end_closes_its_connection() -> None:
    def endless(head: bytes, body: bytes) -> bytes | None:
        if b"/follow" in head:
            return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n"
        return OK_JSON

    async def go(client: Client, server: Server) -> None:
        resp = await client.stream(server.url + "/follow")
        assert await resp.read(10.0) == b"first"
        resp.close()
        assert (await client.get(server.url + "/after")).status_code == 200
        assert server.connections == 2  # the half-read stream's connection was not reused

    exchange(endless, go)
