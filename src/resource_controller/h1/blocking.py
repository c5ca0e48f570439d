"""The core on a blocking socket: ``rc`` and the synchronous API's one connection.
``http.client`` imports ``email`` and ``ssl`` on every start; this needs ``socket``
alone, and ``ssl`` only for an ``https://`` controller.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Protocol

from resource_controller import errors
from resource_controller.h1 import core

#: Most bytes one read asks for; a streamed body's piece comes as soon as it arrives.
READ_SIZE = 65536


def open_socket(end: core.Endpoint, timeout: float | None) -> socket.socket:
    """A connected socket to ``end``, in TLS for ``https://`` (the seam tests replace)."""
    try:
        # An ASCII name as bytes: the resolver then needs no ``encodings.idna``.
        address: str | bytes = end.host.encode("ascii")
    except UnicodeEncodeError:
        address = end.host
    sock = socket.create_connection((address, end.port), timeout)  # type: ignore[arg-type]
    try:
        # Requests are written whole: never wait for an ACK before the next segment.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if end.tls:
            import ssl  # only for https:// controllers

            context = ssl.create_default_context()
            context.set_alpn_protocols(["http/1.1"])
            sock = context.wrap_socket(sock, server_hostname=end.host)
    except BaseException:
        sock.close()
        raise
    return sock


class Socket(Protocol):
    """What a connection uses of its socket (a test's stand-in has just this)."""

    def sendall(self, data: bytes, /) -> None: ...

    def recv(self, size: int, /) -> bytes: ...

    def settimeout(self, timeout: float | None, /) -> None: ...

    def close(self) -> None: ...


#: How a connection's socket is made: ``open_socket``, or a test's stand-in.
Opener = Callable[[core.Endpoint, float | None], Socket]


class Connection:
    """One connection; requests go one after another, each answer read before the next."""

    def __init__(
        self, end: core.Endpoint, timeout: float | None, opener: Opener = open_socket
    ) -> None:
        try:
            self._sock = opener(end, timeout)
        except OSError as exc:
            raise errors.ConnectFailed(core.cause(exc)) from exc
        self._wire = core.Wire(end.authority)
        self._ended = True
        #: A previous answer was read whole on this connection.
        self.reused = False

    def settimeout(self, timeout: float | None) -> None:
        self._sock.settimeout(timeout)

    def request(
        self, method: str, target: str, fields: list[tuple[bytes, bytes]], body: bytes | None
    ) -> core.Head:
        """Send one request and read its answer's head."""
        try:
            self._sock.sendall(self._wire.start(method, target, fields, body))
        except OSError as exc:
            raise self._failed(exc) from exc
        self._ended = False
        while True:
            got = self._next()
            if isinstance(got, core.Head):
                return got

    def read(self) -> bytes:
        """The next piece of the answer's body as soon as it arrives; ``b""`` at its end."""
        if self._ended:
            return b""
        got = self._next()
        assert not isinstance(got, core.Head)
        self._ended = got == core.END
        return got

    def read_all(self) -> bytes:
        parts = []
        while piece := self.read():
            parts.append(piece)
        return b"".join(parts)

    def _next(self) -> core.Head | bytes:
        while (got := self._wire.next()) is None:
            try:
                data = self._sock.recv(READ_SIZE)
            except OSError as exc:
                raise self._failed(exc) from exc
            self._wire.feed(data)
        return got

    def _failed(self, exc: OSError) -> errors.TransportError:
        if isinstance(exc, TimeoutError):
            return errors.TimedOut("timed out")
        if self._wire.answered:
            return errors.AnswerLost(core.cause(exc))
        return errors.Disconnected(core.cause(exc))

    def recycle(self) -> bool:
        """Whether the connection may carry the next request (the answer read whole)."""
        if self._ended and self._wire.recycle():
            self.reused = True
            return True
        return False

    def close(self) -> None:
        """Close the socket; safe to call more than once."""
        self._sock.close()
