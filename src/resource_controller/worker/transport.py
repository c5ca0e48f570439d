"""The worker's HTTP requests, on asyncio streams without an HTTP library (``streams11``).

The worker runs on every device host and sends a handful of small JSON requests per
job; an HTTP library costs it several MiB resident and most of its CPU per request.
``Plain`` speaks HTTP/1.1 itself for ``http://`` controllers, reusing idle keep-alive
connections. What only httpx does, it leaves to httpx, imported on first use
(``worker/viahttpx.py``): ``https://`` controllers (httpx's certificate handling), a
proxy configured in the environment, and a transport injected by the caller.

Either way a request ends with an ``Answer`` (the whole body read), or raises
``TransportError`` when no answer came back: ``ConnectFailed`` when the connection was
never made, so nothing was sent and another controller may take the request.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import Mapping
from typing import Any, Protocol

from resource_controller import http1, streams11

#: Bound on making a connection when the caller set none (the caller's bound wins).
CONNECT_TIMEOUT = 120.0


class TransportError(OSError):
    """No HTTP answer came back; the message says why in one line."""


class ConnectFailed(TransportError):
    """The connection was never made: the request was not sent."""


class Answer:
    """One answer, its body read: what the worker's callers look at."""

    __slots__ = ("content", "headers", "reason_phrase", "status_code")

    def __init__(
        self, status_code: int, reason_phrase: str, headers: Mapping[str, str], content: bytes
    ) -> None:
        self.status_code = status_code
        self.reason_phrase = reason_phrase
        #: Names lowercased, repeated fields joined with ``, ``.
        self.headers = headers
        self.content = content

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    def json(self) -> Any:
        return json.loads(self.content)

    def __repr__(self) -> str:
        return f"<Answer {self.status_code} {self.reason_phrase}>"


class Sender(Protocol):
    """Sends one request to ``base + target`` (``target``: path and query, quoted)."""

    async def request(self, method: str, base: str, target: str, body: bytes | None) -> Answer: ...

    async def aclose(self) -> None: ...


def target_of(path: str, params: Mapping[str, str] | None = None) -> str:
    """``path`` percent-encoded where it must be (IDs go in unescaped), then the query."""
    target = urllib.parse.quote(path, safe="/!$&'()*+,;=:@[]%")
    if params:
        target += "?" + urllib.parse.urlencode(params)
    return target


def json_body(body: Any) -> bytes:
    """A JSON request body, compact."""
    return json.dumps(body, separators=(",", ":")).encode()


class _End:
    """A base URL's pieces, parsed once: where to connect and what prefixes the target."""

    __slots__ = ("host_field", "key", "prefix", "scheme")

    def __init__(self, base: str) -> None:
        parts = urllib.parse.urlsplit(base)
        self.scheme = parts.scheme
        try:
            port = parts.port
        except ValueError as exc:
            raise TransportError(f"invalid URL {base!r}: {exc}") from None
        host = parts.hostname or ""
        if self.scheme == "http" and not host:
            raise TransportError(f"invalid URL {base!r}: no host")
        self.key: streams11.Key = (host, port or 80)
        self.host_field = parts.netloc.rpartition("@")[2].encode("idna")
        self.prefix = parts.path.rstrip("/")


class Plain:
    """``http://`` over ``streams11``; anything else through httpx, built on first use."""

    def __init__(self, headers: Mapping[str, str]) -> None:
        self._headers = dict(headers)
        self._fields = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self._pool = streams11.Pool()
        self._ends: dict[str, _End] = {}
        self._other: Sender | None = None

    async def request(self, method: str, base: str, target: str, body: bytes | None) -> Answer:
        end = self._ends.get(base)
        if end is None:
            end = self._ends[base] = _End(base)
        if end.scheme != "http":
            return await self._httpx().request(method, base, target, body)
        conn = self._pool.take(end.key)
        if conn is None:
            try:
                conn = await self._pool.connect(end.key, CONNECT_TIMEOUT)
            except OSError as exc:
                raise ConnectFailed(str(exc) or type(exc).__name__) from exc
        fields = [*self._fields, (b"Host", end.host_field)]
        if body is not None or method in http1.BODY_METHODS:
            fields.append((b"Content-Length", b"%d" % len(body or b"")))
        try:
            head = await streams11.exchange(conn, method, end.prefix + target, fields, body or b"")
            content = await streams11.read_body(conn, head.framing)
        except http1.ProtocolError as exc:
            conn.close()
            raise TransportError(str(exc)) from exc
        except BaseException:
            conn.close()
            raise
        if head.framing.keep_alive:
            self._pool.give_back(end.key, conn)
        else:
            conn.close()
        return Answer(head.status, head.reason, head.head.fields, content)

    def _httpx(self) -> Sender:
        if self._other is None:
            from resource_controller.worker import viahttpx

            self._other = viahttpx.ViaHttpx(self._headers)
        return self._other

    async def aclose(self) -> None:
        self._pool.close()
        if self._other is not None:
            await self._other.aclose()
        await asyncio.sleep(0)  # let the closed connections' transports finish
