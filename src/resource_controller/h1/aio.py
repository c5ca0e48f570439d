"""The core on asyncio streams: the worker, the asynchronous API, the relay halves, webhooks.

``HttpClient`` keeps idle keep-alive connections per endpoint; a connection interrupted
mid-exchange is closed, never reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from resource_controller import errors
from resource_controller.h1 import core

READ_SIZE = 65536
MAX_IDLE = 16
#: What of a refused relay stream's answer is read to explain it, and for how long.
REFUSAL_MAX = 65536
REFUSAL_WAIT = 5.0

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]
#: Opens a connection to an endpoint within a bound: ``open_tcp``, or a test's fake.
Connect = Callable[[core.Endpoint, float | None], Awaitable[Streams]]


async def open_tcp(end: core.Endpoint, timeout: float | None) -> Streams:
    """A TCP connection to ``end``, in TLS with the standard library's checks for ``https://``."""
    context = None
    if end.tls:
        import ssl  # only for https:// peers

        context = ssl.create_default_context()
    async with asyncio.timeout(timeout):
        return await asyncio.open_connection(end.host, end.port, ssl=context)


class Answer:
    """One answer, its body read: what callers look at."""

    __slots__ = ("content", "headers", "reason_phrase", "status_code")

    def __init__(self, head: core.Head, content: bytes) -> None:
        self.status_code = head.status
        self.reason_phrase = head.reason
        self.headers = head.headers
        self.content = content

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    def json(self) -> Any:
        return json.loads(self.content)

    def __repr__(self) -> str:
        return f"<Answer {self.status_code} {self.reason_phrase}>"


class _Conn:
    """One connection: its streams and its protocol state."""

    __slots__ = ("reader", "wire", "writer")

    def __init__(self, streams: Streams, wire: core.Wire) -> None:
        self.reader, self.writer = streams
        self.wire = wire

    @property
    def usable(self) -> bool:
        """Still open both ways: the server may have closed it while it sat idle."""
        return not self.reader.at_eof() and not self.writer.is_closing()


class Exchange:
    """One request on one connection; ``head`` is its answer's once ``HttpClient.open`` returns."""

    def __init__(self, conn: _Conn, done: Callable[[_Conn, bool], None]) -> None:
        self._conn = conn
        self._done: Callable[[_Conn, bool], None] | None = done
        self._ended = False
        self.head = core.Head(0, "", {})

    @property
    def status(self) -> int:
        return self.head.status

    @property
    def headers(self) -> dict[str, str]:
        return self.head.headers

    async def _send(self, data: bytes) -> None:
        try:
            self._conn.writer.write(data)
            await self._conn.writer.drain()
        except (OSError, RuntimeError) as exc:
            raise errors.Disconnected(f"write: {core.cause(exc)}") from exc

    async def write(self, data: bytes) -> None:
        """Send one chunk of the open request body now (never held to make a larger one)."""
        if not data:
            return
        try:
            framed = self._conn.wire.write(data)
        except Exception as exc:  # h11's: the body was not opened, or has ended
            raise errors.TransportError("this stream has no open request body") from exc
        await self._send(framed)

    async def finish(self) -> None:
        """End the open request body (the peer sees its end); safe to repeat."""
        if framed := self._conn.wire.finish():
            await self._send(framed)

    async def _next(self, idle: float | None) -> core.Head | bytes:
        conn = self._conn
        try:
            while (got := conn.wire.next()) is None:
                async with asyncio.timeout(idle):
                    data = await conn.reader.read(READ_SIZE)
                conn.wire.feed(data)
        except TimeoutError:
            self.close()
            raise errors.TimedOut("timed out") from None
        except OSError as exc:
            self.close()
            kind = errors.AnswerLost if conn.wire.answered else errors.Disconnected
            raise kind(core.cause(exc)) from exc
        except BaseException:
            self.close()
            raise
        return got

    async def read(self, idle: float | None = None) -> bytes:
        """The next piece of the body, waiting at most ``idle`` s for it; ``b""`` at its end."""
        if self._ended:
            return b""
        got = await self._next(idle)
        assert not isinstance(got, core.Head)
        if got == core.END:
            self._ended = True
            if self._done is not None:
                done, self._done = self._done, None
                done(self._conn, self._conn.wire.recycle())
        return got

    async def read_all(self, idle: float | None, limit: int | None = None) -> bytes:
        """The rest of the body, or its first ``limit`` bytes (the connection then closes)."""
        parts = bytearray()
        while piece := await self.read(idle):
            parts += piece
            if limit is not None and len(parts) >= limit:
                self.close()
                return bytes(parts[:limit])
        return bytes(parts)

    def close(self) -> None:
        """Drop the connection unless the answer ended and it went back; idempotent."""
        if self._done is not None:
            self._done = None
            self._conn.writer.close()

    async def wait_closed(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            await self._conn.writer.wait_closed()


class HttpClient:
    """Requests with fixed headers; idle keep-alive connections reused per endpoint."""

    def __init__(self, headers: Mapping[str, str] | None = None, *, connect: Connect = open_tcp):
        self._fields = [
            (k.encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()
        ]
        self._connect = connect
        self._idle: dict[core.Endpoint, list[_Conn]] = {}

    def _take(self, end: core.Endpoint) -> _Conn | None:
        idle = self._idle.get(end)
        while idle:
            conn = idle.pop()
            if conn.usable:
                return conn
            conn.writer.close()
        return None

    def _give_back(self, end: core.Endpoint) -> Callable[[_Conn, bool], None]:
        def done(conn: _Conn, reusable: bool) -> None:
            idle = self._idle.setdefault(end, [])
            if reusable and conn.usable and len(idle) < MAX_IDLE:
                idle.append(conn)
            else:
                conn.writer.close()

        return done

    async def _connection(self, end: core.Endpoint, timeout: float | None, pooled: bool) -> _Conn:
        """An idle connection to ``end`` (when ``pooled``), or a new one within ``timeout``."""
        conn = self._take(end) if pooled else None
        if conn is None:
            try:
                streams = await self._connect(end, timeout)
            except (OSError, TimeoutError) as exc:
                raise errors.ConnectFailed(core.cause(exc)) from exc
            conn = _Conn(streams, core.Wire(end.authority))
        return conn

    async def _exchange(
        self,
        conn: _Conn,
        end: core.Endpoint,
        request: tuple[str, str, bytes | None],
        fields: list[tuple[bytes, bytes]] | None,
        open_body: bool,
        timeout: float | None,
    ) -> Exchange:
        method, target, body = request
        exchange = Exchange(conn, _close if open_body else self._give_back(end))
        head = conn.wire.start(
            method, end.prefix + target, [*self._fields, *(fields or ())], body, open_body=open_body
        )
        try:
            await exchange._send(head)
        except BaseException:
            exchange.close()
            raise
        got = await exchange._next(timeout)
        assert isinstance(got, core.Head)
        exchange.head = got
        return exchange

    async def open(
        self,
        method: str,
        end: core.Endpoint,
        target: str,
        body: bytes | None = None,
        *,
        timeout: float | None,
        connect_timeout: float | None = None,
        fields: list[tuple[bytes, bytes]] | None = None,
        open_body: bool = False,
    ) -> Exchange:
        """Send the request and read its answer's head, connecting within ``connect_timeout``
        (else ``timeout`` bounds both); ``open_body`` leaves a chunked body open, unpooled."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        bound = timeout if connect_timeout is None else connect_timeout
        conn = await self._connection(end, bound, not open_body)
        if timeout is not None and connect_timeout is None:
            timeout = max(0.0, timeout - (loop.time() - started))
        return await self._exchange(conn, end, (method, target, body), fields, open_body, timeout)

    async def request(
        self,
        method: str,
        end: core.Endpoint,
        target: str,
        body: bytes | None = None,
        *,
        timeout: float,
        limit: int | None = None,
    ) -> Answer:
        """One request and its whole answer (at most ``limit`` bytes), all within one
        ``timeout``: ``ConnectFailed`` before connecting, ``TimedOut`` after."""
        conn = exchange = None
        try:
            async with asyncio.timeout(timeout):
                conn = await self._connection(end, None, True)
                exchange = await self._exchange(
                    conn, end, (method, target, body), None, False, None
                )
                content = await exchange.read_all(None, limit)
        except TimeoutError:
            if exchange is not None:
                exchange.close()
            elif conn is not None:
                conn.writer.close()
            kind = errors.ConnectFailed if conn is None else errors.TimedOut
            raise kind("timed out") from None
        return Answer(exchange.head, content)

    async def aclose(self) -> None:
        """Close every idle connection."""
        for idle in self._idle.values():
            for conn in idle:
                conn.writer.close()
        self._idle.clear()
        await asyncio.sleep(0)  # let the closed connections' transports finish


def _close(conn: _Conn, _reusable: bool) -> None:
    conn.writer.close()


async def relay(
    base_url: str,
    method: str,
    path: str,
    token: str,
    *,
    content_type: str = "application/octet-stream",
    timeout: float = 30.0,
    connect: Connect = open_tcp,
) -> Exchange:
    """Open one relay half once its ``200`` head arrived; any other is ``errors.Refused``."""
    try:
        end = core.endpoint(base_url)
    except ValueError as exc:
        raise errors.TransportError(f"controller URL {exc}") from None
    client = HttpClient(
        {"Authorization": core.bearer(token), "Content-Type": content_type, "Accept": "*/*"},
        connect=connect,
    )
    try:
        exchange = await client.open(method, end, path, timeout=timeout, open_body=method == "POST")
    except errors.TransportError as exc:
        raise type(exc)(f"{method} {path}: {exc}") from exc
    if exchange.status != 200:
        said = b""
        with contextlib.suppress(errors.TransportError, TimeoutError):
            async with asyncio.timeout(REFUSAL_WAIT):
                said = await exchange.read_all(REFUSAL_WAIT, REFUSAL_MAX)
        exchange.close()
        raise errors.Refused(exchange.status, exchange.head.reason, *core.error_body(said))
    return exchange
