"""A plain HTTP/1.1 transport under the asynchronous client's httpx.

Its requests are small JSON bodies and small answers on loopback or a LAN. Under
httpx's default transport each one goes through httpcore's connection pool and anyio's
stream layer, which cost more CPU than the controller's answer takes to arrive, and
building that transport loads a CA bundle into an SSL context (about 7.5 MiB resident)
that a plain ``http://`` controller never uses. This transport speaks HTTP/1.1 on
asyncio streams directly (``streams11``, which the worker's requests use without
httpx): one connection per request in flight, idle keep-alive connections reused, the
answer's body read as the caller iterates it (Content-Length, chunked, or to the end
of the connection). The ``httpx.AsyncClient`` above it is unchanged: headers, JSON
bodies, ``httpx.Response``, content decoding, streaming.

``https://`` URLs go to httpx's own transport, built on first use; so does everything
when a proxy is configured in the environment (the caller decides, with ``proxied``),
since only httpx's transport honours proxies. Bounds come from the caller; a
connection interrupted mid-exchange, by an error or a cancellation, is closed, never
reused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from resource_controller import http1, streams11
from resource_controller.httpxlite import httpx

#: Whether httpx would send plain-http requests through a proxy (``streams11``'s rule).
proxied = streams11.proxied


class Transport(httpx.AsyncBaseTransport):
    """HTTP/1.1 for ``http://`` URLs over asyncio streams; anything else through httpx."""

    def __init__(self) -> None:
        self._pool = streams11.Pool()
        self._fallback: httpx.AsyncHTTPTransport | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            if self._fallback is None:
                self._fallback = httpx.AsyncHTTPTransport()
            return await self._fallback.handle_async_request(request)
        key = (url.host, url.port or 80)
        conn = self._pool.take(key)
        if conn is None:
            conn = await self._pool.connect(
                key, request.extensions.get("timeout", {}).get("connect")
            )
        try:
            return await _exchange(conn, request, lambda: self._pool.give_back(key, conn))
        except BaseException:
            conn.close()
            raise

    async def aclose(self) -> None:
        self._pool.close()
        if self._fallback is not None:
            await self._fallback.aclose()


async def _exchange(
    conn: streams11.Conn, request: httpx.Request, give_back: Callable[[], None]
) -> httpx.Response:
    """Send ``request`` and read its answer's head; the body streams (``_Body``)."""
    body = await request.aread()
    # httpx has already set Host and Content-Length (for a body it knows the size of).
    fields = request.headers.raw
    if body and "content-length" not in request.headers:
        fields = [*fields, (b"Content-Length", b"%d" % len(body))]
    target = request.url.raw_path.decode("ascii")
    try:
        answer = await streams11.exchange(conn, request.method, target, fields, body)
    except http1.ProtocolError as exc:
        raise httpx.RemoteProtocolError(str(exc)) from exc
    return httpx.Response(
        answer.status,
        headers=answer.head.raw,
        stream=_Body(conn, answer.framing, give_back),
        request=request,
        extensions={
            "http_version": b"HTTP/1.1" if answer.version == 11 else b"HTTP/1.0",
            "reason_phrase": answer.reason.encode("latin-1"),
        },
    )


class _Body(httpx.AsyncByteStream):
    """An answer's body, read as the caller iterates it (a log follow streams for hours).

    Read to its end by its framing, the connection goes back to the idle pool; closed
    early, failed or cancelled, the connection is closed, never reused.
    """

    def __init__(
        self, conn: streams11.Conn, framing: http1.Framing, give_back: Callable[[], None]
    ) -> None:
        self._conn = conn
        self._framing = framing
        self._give_back = give_back
        self._settled = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for piece in streams11.body_chunks(self._conn, self._framing):
                yield piece
        except http1.ProtocolError as exc:
            self._settle(reuse=False)
            raise httpx.RemoteProtocolError(str(exc)) from exc
        except BaseException:
            self._settle(reuse=False)
            raise
        self._settle(reuse=self._framing.keep_alive)

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
