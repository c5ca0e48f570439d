"""Full-duplex HTTP/1.1 streams on asyncio, for the relay halves.

A relay POST must see its ``200`` while its request body is still being written, and
must put each chunk on the wire the moment it is written. Common HTTP clients send the
whole body before reading the answer, so both ends of the relay (the worker and the
client) drive the exchange themselves here: a request line and headers, a chunked
body written chunk by chunk, a response read as soon as it arrives (chunked, sized or
to end of stream), by the format's rules in ``http1``. Standard library only, so
``rc run --tty`` stays light.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import urllib.parse
from dataclasses import dataclass

from resource_controller import http1

#: Longest line the stream reader buffers (status, header or chunk-size line).
_LINE_MAX = 16_384
#: Most bytes of an error answer read to explain it.
_ERROR_BODY_MAX = 65_536
#: Most bytes one ``read`` returns.
READ_MAX = 65_536


class StreamError(Exception):
    """The stream could not be opened, or broke; the message says why in one line."""


class Refused(StreamError):
    """The controller answered, but not ``200``."""

    def __init__(self, status: int, reason: str, body: bytes) -> None:
        self.status = status
        self.reason = reason
        self.body = body
        self.code, self.detail = http1.error_body(body)
        super().__init__(f"controller returned {self.status_line}")

    @property
    def status_line(self) -> str:
        return f"{self.status} {self.reason}".strip()

    def describe(self) -> str:
        """``code: message`` when the answer carried the spec's error body."""
        if self.code:
            return f"{self.code}: {self.detail}" if self.detail else self.code
        return str(self)


@dataclass(frozen=True)
class Endpoint:
    """Where a controller listens, from its base URL."""

    scheme: str
    host: str
    port: int
    prefix: str

    @classmethod
    def parse(cls, base_url: str) -> Endpoint:
        parts = urllib.parse.urlsplit(base_url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise StreamError(f"controller URL {base_url!r} is not an http:// or https:// URL")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise StreamError(f"controller URL {base_url!r}: {exc}") from None
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


class Stream:
    """One open relay stream: write the request body (POST), read the response body."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, chunked: bool
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._body_chunked = chunked
        self._finished = False
        self._remaining: int | None = None  # response body: bytes left (sized)
        self._chunked_response = False
        self._chunk_left = 0
        self._eof = False
        #: The response headers, names lowercased.
        self.headers: dict[str, str] = {}

    # ---- the request body ------------------------------------------------------------

    async def write(self, data: bytes) -> None:
        """Send one chunk of the request body now (never buffered into larger blocks)."""
        if not data:
            return
        if not self._body_chunked or self._finished:
            raise StreamError("this stream has no open request body")
        try:
            self._writer.write(b"%x\r\n%b\r\n" % (len(data), data))
            await self._writer.drain()
        except (OSError, RuntimeError) as exc:
            raise StreamError(f"write: {_cause(exc)}") from exc

    async def finish(self) -> None:
        """End the request body (the peer sees end of stream); safe to repeat."""
        if not self._body_chunked or self._finished:
            return
        self._finished = True
        try:
            self._writer.write(b"0\r\n\r\n")
            await self._writer.drain()
        except (OSError, RuntimeError) as exc:
            raise StreamError(f"finish: {_cause(exc)}") from exc

    # ---- the response body -----------------------------------------------------------

    async def read(self) -> bytes:
        """The next piece of the response body; ``b""`` at its end."""
        try:
            return await self._read()
        except (OSError, asyncio.IncompleteReadError, ValueError, http1.ProtocolError) as exc:
            raise StreamError(f"read: {_cause(exc)}") from exc

    async def _read(self) -> bytes:
        if self._eof:
            return b""
        if self._chunked_response:
            if self._chunk_left == 0:
                size = http1.chunk_size(await self._reader.readuntil(b"\r\n"))
                if size == 0:
                    trailer = http1.Head()
                    while not trailer.feed(await self._reader.readuntil(b"\r\n")):
                        pass
                    self._eof = True
                    return b""
                self._chunk_left = size
            data = await self._reader.read(min(self._chunk_left, READ_MAX))
            if not data:
                raise asyncio.IncompleteReadError(b"", self._chunk_left)
            self._chunk_left -= len(data)
            if self._chunk_left == 0:
                await self._reader.readexactly(2)
            return data
        if self._remaining is not None:
            if self._remaining == 0:
                self._eof = True
                return b""
            data = await self._reader.read(min(self._remaining, READ_MAX))
            if not data:
                raise asyncio.IncompleteReadError(b"", self._remaining)
            self._remaining -= len(data)
            return data
        data = await self._reader.read(READ_MAX)
        if not data:
            self._eof = True
        return data

    def close(self) -> None:
        """Drop the connection; safe to call more than once."""
        self._writer.close()

    async def wait_closed(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            await self._writer.wait_closed()


def _cause(exc: BaseException) -> str:
    if isinstance(exc, asyncio.IncompleteReadError):
        return "the connection closed mid-stream"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[:1].lower() + exc.strerror[1:]
    return str(exc) or type(exc).__name__


async def open_stream(
    base_url: str,
    method: str,
    path: str,
    token: str,
    *,
    content_type: str = "application/octet-stream",
    connect_timeout: float | None = 30.0,
) -> Stream:
    """Open ``method path`` and return once the ``200`` headers arrived.

    A ``POST`` gets a chunked request body that stays open (``Stream.write``,
    ``Stream.finish``); the headers are read while it is open. Any other status raises
    ``Refused``; no answer raises ``StreamError``. Neither stream has a timeout once
    open: only connecting and the status line are bounded.
    """
    end = Endpoint.parse(base_url)
    context = ssl.create_default_context() if end.scheme == "https" else None
    try:
        async with asyncio.timeout(connect_timeout):
            reader, writer = await asyncio.open_connection(
                end.host, end.port, ssl=context, limit=_LINE_MAX
            )
    except TimeoutError:
        raise StreamError(f"connect {end.host}:{end.port}: timed out") from None
    except OSError as exc:
        raise StreamError(f"connect {end.host}:{end.port}: {_cause(exc)}") from exc
    body = method == "POST"
    head = [
        f"{method} {end.prefix}{path} HTTP/1.1",
        f"Host: {end.host_header}",
        f"Authorization: Bearer {token}",
        f"Content-Type: {content_type}",
        "Accept: */*",
    ]
    if body:
        head.append("Transfer-Encoding: chunked")
    stream = Stream(reader, writer, chunked=body)
    try:
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()
        async with asyncio.timeout(connect_timeout):
            version, status, reason = http1.status_line(await reader.readuntil(b"\r\n"))
            answer = http1.Head()
            while not answer.feed(await reader.readuntil(b"\r\n")):
                pass
            framing = http1.Framing(method, version, status, answer.fields)
    except TimeoutError:
        stream.close()
        raise StreamError(f"{method} {path}: no answer") from None
    except (
        OSError,
        asyncio.IncompleteReadError,
        asyncio.LimitOverrunError,
        ValueError,
        http1.ProtocolError,
    ) as exc:
        stream.close()
        raise StreamError(f"{method} {path}: {_cause(exc)}") from exc
    stream.headers = answer.fields
    stream._chunked_response = framing.chunked
    stream._remaining = framing.length
    if status != 200:
        refused = await _error_answer(stream)
        stream.close()
        raise Refused(status, reason, refused)
    return stream


async def _error_answer(stream: Stream) -> bytes:
    """What a refusal said, at most ``_ERROR_BODY_MAX`` bytes, read within a bound."""
    got = bytearray()
    try:
        async with asyncio.timeout(5.0):
            while len(got) < _ERROR_BODY_MAX:
                piece = await stream.read()
                if not piece:
                    break
                got += piece
    except (TimeoutError, StreamError):
        pass
    return bytes(got[:_ERROR_BODY_MAX])
