"""A plain HTTP/1.1 transport under the worker's and the asynchronous client's httpx.

Their requests are small JSON bodies and small answers on loopback or a LAN,
three or more per job. Under httpx's default transport each one goes through
httpcore's connection pool and anyio's stream layer, which cost more CPU than the
controller's answer takes to arrive, and building that transport loads a CA bundle
into an SSL context (about 7.5 MiB resident) that a plain ``http://`` controller never
uses. This transport speaks HTTP/1.1 on asyncio streams directly: one connection per
request in flight, idle keep-alive connections reused, the answer's body read as the
caller iterates it (Content-Length, chunked, or to the end of the connection). The
``httpx.AsyncClient`` above it is unchanged: headers, JSON bodies, ``httpx.Response``,
content decoding, streaming. The format's rules are ``http1``'s.

``https://`` URLs go to httpx's own transport, built on first use; so does everything
when a proxy is configured in the environment (``Channel.open`` decides), since only
httpx's transport honours proxies. Bounds come from the caller (the channel wraps
every request in ``asyncio.timeout``); a connection interrupted mid-exchange, by an
error or a cancellation, is closed, never reused.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping

import httpx

from resource_controller import http1

#: Idle connections kept per host and port; more are closed on return.
MAX_IDLE = 16
#: Most bytes one read of a body that runs to the end of the connection returns.
READ_MAX = 65536
#: Environment variables that route plain-http requests through a proxy in httpx.
PROXY_VARS = frozenset({"http_proxy", "all_proxy"})


def proxied(environ: Mapping[str, str]) -> bool:
    """Whether httpx would send plain-http requests through a proxy from ``environ``."""
    return any(k.lower() in PROXY_VARS and v for k, v in environ.items())


class _Conn:
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


class Transport(httpx.AsyncBaseTransport):
    """HTTP/1.1 for ``http://`` URLs over asyncio streams; anything else through httpx."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._fallback: httpx.AsyncHTTPTransport | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            if self._fallback is None:
                self._fallback = httpx.AsyncHTTPTransport()
            return await self._fallback.handle_async_request(request)
        key = (url.host, url.port or 80)
        conn = self._take(key)
        if conn is None:
            timeout = request.extensions.get("timeout", {}).get("connect")
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(key[0], key[1])
            conn = _Conn(reader, writer)
        try:
            return await _exchange(conn, request, lambda: self._give_back(key, conn))
        except BaseException:
            conn.close()
            raise

    def _take(self, key: tuple[str, int]) -> _Conn | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.usable:
                return conn
            conn.close()
        return None

    def _give_back(self, key: tuple[str, int], conn: _Conn) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) >= MAX_IDLE:
            conn.close()
        else:
            idle.append(conn)

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
        if self._fallback is not None:
            await self._fallback.aclose()


async def _exchange(
    conn: _Conn, request: httpx.Request, give_back: Callable[[], None]
) -> httpx.Response:
    """Send ``request`` and read its answer's head; the body streams (``_Body``)."""
    body = await request.aread()
    # httpx has already set Host and Content-Length (for a body it knows the size of).
    fields = request.headers.raw
    if body and "content-length" not in request.headers:
        fields = [*fields, (b"Content-Length", b"%d" % len(body))]
    target = request.url.raw_path.decode("ascii")
    conn.writer.write(http1.request_head(request.method, target, fields) + body)
    await conn.writer.drain()
    reader = conn.reader
    try:
        while True:
            version, status, reason = http1.status_line(await reader.readline())
            head = http1.Head()
            while not head.feed(await reader.readline()):
                pass
            if not 100 <= status < 200:
                break  # an interim answer (100 Continue) is followed by the real one
        framing = http1.Framing(request.method, version, status, head.fields)
    except http1.ProtocolError as exc:
        raise httpx.RemoteProtocolError(str(exc)) from exc
    return httpx.Response(
        status,
        headers=head.raw,
        stream=_Body(conn, framing, give_back),
        request=request,
        extensions={
            "http_version": b"HTTP/1.1" if version == 11 else b"HTTP/1.0",
            "reason_phrase": reason.encode("latin-1"),
        },
    )


class _Body(httpx.AsyncByteStream):
    """An answer's body, read as the caller iterates it (a log follow streams for hours).

    Read to its end by its framing, the connection goes back to the idle pool; closed
    early, failed or cancelled, the connection is closed, never reused.
    """

    def __init__(self, conn: _Conn, framing: http1.Framing, give_back: Callable[[], None]) -> None:
        self._conn = conn
        self._framing = framing
        self._give_back = give_back
        self._settled = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        reader = self._conn.reader
        framing = self._framing
        try:
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
        except http1.ProtocolError as exc:
            self._settle(reuse=False)
            raise httpx.RemoteProtocolError(str(exc)) from exc
        except BaseException:
            self._settle(reuse=False)
            raise
        self._settle(reuse=framing.keep_alive)

    def _settle(self, *, reuse: bool) -> None:
        if self._settled:
            return
        self._settled = True
        if reuse:
            self._give_back()
        else:
            self._conn.close()

    async def aclose(self) -> None:
        self._settle(reuse=False)  # a no-op once the body was read to its end


async def _exactly(reader: asyncio.StreamReader, n: int) -> bytes:
    try:
        return await reader.readexactly(n)
    except asyncio.IncompleteReadError as exc:
        raise http1.IncompleteRead() from exc
