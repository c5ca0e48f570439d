"""HTTP/1.1 exchanges on asyncio streams, with no HTTP library: connections, idle reuse, answers.

Shared by the httpx transport of the asynchronous client (``asynchttp``) and the
worker's own requests (``worker/requests.py``), which runs on every device host and
must not load an HTTP library for a handful of small JSON requests per job. The
format's rules are ``http1``'s; this module owns only the reads and writes. A caller
that reads an answer's body to its end gives the connection back (``Pool.give_back``)
when the framing allows it, and closes it otherwise, on any error or cancellation.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import NamedTuple

from resource_controller import http1

#: Idle connections kept per host and port; more are closed on return.
MAX_IDLE = 16
#: Most bytes one read of a body that runs to the end of the connection returns.
READ_MAX = 65536
#: Environment variables that route plain-http requests through a proxy in httpx.
PROXY_VARS = frozenset({"http_proxy", "all_proxy"})


def proxied(environ: Mapping[str, str]) -> bool:
    """Whether httpx would send plain-http requests through a proxy from ``environ``:
    such requests must go through httpx, the only one of our clients that honours one."""
    return any(k.lower() in PROXY_VARS and v for k, v in environ.items())


class Conn:
    """One connection's two streams."""

    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @property
    def usable(self) -> bool:
        """Still open both ways: the server may have closed it while it sat idle."""
        return not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        self.writer.close()


#: A pool's key: host and port.
Key = tuple[str, int]


class Pool:
    """Idle keep-alive connections by host and port; a new one when none is usable."""

    def __init__(self) -> None:
        self._idle: dict[Key, list[Conn]] = {}

    def take(self, key: Key) -> Conn | None:
        """An idle connection still open both ways, or None."""
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.usable:
                return conn
            conn.close()
        return None

    async def connect(self, key: Key, timeout: float | None = None) -> Conn:
        """A new plain connection to ``key``, within ``timeout`` seconds when given."""
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(key[0], key[1])
        return Conn(reader, writer)

    def give_back(self, key: Key, conn: Conn) -> None:
        """Keep ``conn`` for the next request to ``key``, unless enough are idle."""
        idle = self._idle.setdefault(key, [])
        if len(idle) >= MAX_IDLE:
            conn.close()
        else:
            idle.append(conn)

    def close(self) -> None:
        """Close every idle connection."""
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


class AnswerHead(NamedTuple):
    """An answer's status line and headers, and how its body is framed."""

    version: int
    status: int
    reason: str
    head: http1.Head
    framing: http1.Framing


async def exchange(
    conn: Conn, method: str, target: str, fields: list[tuple[bytes, bytes]], body: bytes
) -> AnswerHead:
    """Send one request (``fields`` complete: Host, Content-Length) and read the answer's head.

    Raises ``http1.ProtocolError`` for an answer that cannot be read.
    """
    conn.writer.write(http1.request_head(method, target, fields) + body)
    await conn.writer.drain()
    reader = conn.reader
    while True:
        version, status, reason = http1.status_line(await reader.readline())
        head = http1.Head()
        while not head.feed(await reader.readline()):
            pass
        if not 100 <= status < 200:
            break  # an interim answer (100 Continue) is followed by the real one
    return AnswerHead(
        version, status, reason, head, http1.Framing(method, version, status, head.fields)
    )


async def body_chunks(conn: Conn, framing: http1.Framing) -> AsyncIterator[bytes]:
    """The answer's body as it arrives (Content-Length, chunked, or to the end).

    Raises ``http1.ProtocolError`` for a body that breaks its framing.
    """
    reader = conn.reader
    if framing.chunked:
        while size := http1.chunk_size(await reader.readline()):
            yield await _exactly(reader, size)
            if await _exactly(reader, 2) != b"\r\n":
                raise http1.ProtocolError("chunk not followed by CRLF")
        trailer = http1.Head()
        while not trailer.feed(await reader.readline()):
            pass
    elif framing.length is not None:
        if framing.length:
            yield await _exactly(reader, framing.length)
    else:
        while piece := await reader.read(READ_MAX):  # to the end of the connection
            yield piece


async def read_body(conn: Conn, framing: http1.Framing) -> bytes:
    """The whole body at once: the common case of a small answer needs no iterator."""
    if not framing.chunked and framing.length is not None:
        return await _exactly(conn.reader, framing.length) if framing.length else b""
    return b"".join([piece async for piece in body_chunks(conn, framing)])


async def _exactly(reader: asyncio.StreamReader, n: int) -> bytes:
    try:
        return await reader.readexactly(n)
    except asyncio.IncompleteReadError as exc:
        raise http1.IncompleteRead() from exc
