"""A plain HTTP/1.1 transport under the worker's ``httpx.AsyncClient``.

The worker's requests are small JSON bodies and small answers on loopback or a LAN,
three or more per job. Under httpx's default transport each one goes through
httpcore's connection pool and anyio's stream layer, which cost more CPU than the
controller's answer takes to arrive, and building that transport loads a CA bundle
into an SSL context (about 7.5 MiB resident) that a plain ``http://`` controller never
uses. This transport speaks HTTP/1.1 on asyncio streams directly: one connection per
request in flight, idle keep-alive connections reused, the answer read whole
(Content-Length, chunked, or to the end of the connection). The ``httpx.AsyncClient``
above it is unchanged: headers, JSON bodies, ``httpx.Response``, content decoding.

``https://`` URLs go to httpx's own transport, built on first use; so does everything
when a proxy is configured in the environment (``Channel.open`` decides), since only
httpx's transport honours proxies. Bounds come from the caller (the channel wraps
every request in ``asyncio.timeout``); a connection interrupted mid-exchange, by an
error or a cancellation, is closed, never reused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import httpx

#: Idle connections kept per host and port; more are closed on return.
MAX_IDLE = 16
#: Answers without a body whatever their headers say (RFC 9112 §6.3).
_NO_BODY = frozenset({204, 304})
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
            response, keep = await _exchange(conn, request)
        except BaseException:
            conn.close()
            raise
        if keep:
            self._give_back(key, conn)
        else:
            conn.close()
        return response

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


def _head(request: httpx.Request, body: bytes) -> bytes:
    """The request line and headers; httpx has already set Host and Content-Length."""
    lines = [request.method.encode("ascii"), b" ", request.url.raw_path, b" HTTP/1.1\r\n"]
    has_length = False
    for name, value in request.headers.raw:
        has_length = has_length or name.lower() == b"content-length"
        lines += [name, b": ", value, b"\r\n"]
    if body and not has_length:
        lines.append(b"Content-Length: %d\r\n" % len(body))
    lines.append(b"\r\n")
    return b"".join(lines)


async def _exchange(conn: _Conn, request: httpx.Request) -> tuple[httpx.Response, bool]:
    """Send ``request`` and read its whole answer; whether the connection may be reused."""
    body = await request.aread()
    conn.writer.write(_head(request, body) + body)
    await conn.writer.drain()
    reader = conn.reader
    while True:
        status, reason, version = _status_line(await reader.readline())
        headers = await _headers(reader)
        if not 100 <= status < 200:
            break  # an interim answer (100 Continue) is followed by the real one
    fields = {name.lower(): value for name, value in headers}
    keep = version == b"HTTP/1.1" and b"close" not in fields.get(b"connection", b"").lower()
    if request.method == "HEAD" or status in _NO_BODY:
        content = b""
    elif b"chunked" in fields.get(b"transfer-encoding", b"").lower():
        content = await _chunked(reader)
    elif b"content-length" in fields:
        try:
            length = int(fields[b"content-length"])
        except ValueError:
            raise httpx.RemoteProtocolError("malformed Content-Length") from None
        content = await _exactly(reader, length)
    else:
        content = await reader.read()  # delimited by the end of the connection
        keep = False
    response = httpx.Response(
        status,
        headers=headers,
        stream=httpx.ByteStream(content),
        request=request,
        extensions={"http_version": version, "reason_phrase": reason},
    )
    return response, keep


def _status_line(line: bytes) -> tuple[int, bytes, bytes]:
    if not line:
        raise httpx.RemoteProtocolError("server disconnected without sending a response")
    parts = line.rstrip(b"\r\n").split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise httpx.RemoteProtocolError(f"malformed status line {line[:80]!r}")
    return int(parts[1]), (parts[2] if len(parts) > 2 else b""), parts[0]


async def _headers(reader: asyncio.StreamReader) -> list[tuple[bytes, bytes]]:
    headers: list[tuple[bytes, bytes]] = []
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n"):
            return headers
        if not line.endswith(b"\n"):
            raise httpx.RemoteProtocolError("connection closed inside the headers")
        name, colon, value = line.partition(b":")
        if not colon or not name.strip():
            raise httpx.RemoteProtocolError(f"malformed header line {line[:80]!r}")
        headers.append((name.strip(), value.strip()))


async def _exactly(reader: asyncio.StreamReader, n: int) -> bytes:
    try:
        return await reader.readexactly(n)
    except asyncio.IncompleteReadError as exc:
        raise httpx.RemoteProtocolError("connection closed inside the body") from exc


async def _chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size_line = await reader.readline()
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise httpx.RemoteProtocolError("malformed chunk size") from None
        if size == 0:
            await _headers(reader)  # trailers, then the blank line
            return b"".join(parts)
        parts.append(await _exactly(reader, size))
        if await _exactly(reader, 2) != b"\r\n":
            raise httpx.RemoteProtocolError("chunk not followed by CRLF")
