"""HTTP/1.1 on a plain socket: the client's one connection to the controller.

``http.client`` imports ``email`` (to parse headers) and ``ssl`` on every start, which
costs ``rc run`` more than everything else it does before its first request. The
client needs little of it: requests with a JSON body or none, answers framed by
``Content-Length``, chunked, or by the close of the connection, keep-alive, and an
answer read chunk by chunk as it arrives (a log follow). ``https://`` wraps the same
socket in TLS, loading ``ssl`` only then, with the standard library's defaults
(certificate and host name checked), as ``http.client`` would.

Errors are ``OSError`` (refused, reset, timed out: the socket's own) or
``ProtocolError``; ``RemoteDisconnected`` is what an idle kept-alive connection the
server has closed looks like, which the caller may retry once. The format's rules
(status and header lines, framing, chunk sizes) are ``http1``'s; this module owns the
socket.
"""

from __future__ import annotations

import socket

from resource_controller import http1
from resource_controller.http1 import IncompleteRead, ProtocolError

__all__ = ["Connection", "IncompleteRead", "ProtocolError", "RemoteDisconnected", "Response"]


class RemoteDisconnected(ConnectionResetError):
    """The server closed the connection without sending a status line."""


class Connection:
    """One TCP (or TLS) connection; requests on it go one after another."""

    def __init__(self, host: str, port: int, *, tls: bool, timeout: float | None) -> None:
        try:
            # An ASCII name as bytes: the resolver then needs no ``encodings.idna``.
            address: str | bytes = host.encode("ascii")
        except UnicodeEncodeError:
            address = host
        sock = socket.create_connection((address, port), timeout)  # type: ignore[arg-type]
        try:
            # Requests are written whole: never wait for an ACK before the next segment.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls:
                import ssl  # only for https:// controllers

                context = ssl.create_default_context()
                context.set_alpn_protocols(["http/1.1"])
                sock = context.wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise
        self.sock: socket.socket = sock
        self._reader = sock.makefile("rb")
        name = f"[{host}]" if ":" in host else host
        default = 443 if tls else 80
        authority = name if port == default else f"{name}:{port}"
        try:
            self._host = authority.encode("ascii")
        except UnicodeEncodeError:
            self._host = authority.encode("idna")

    def settimeout(self, timeout: float | None) -> None:
        """Bound each later socket operation (``None``: wait as long as it takes)."""
        self.sock.settimeout(timeout)

    def send(self, method: str, target: str, headers: dict[str, str], body: bytes | None) -> None:
        """Write one request, head and body, in one go."""
        fields = [(b"Host", self._host), (b"Accept-Encoding", b"identity")]
        if body is not None:
            fields.append((b"Content-Length", b"%d" % len(body)))
        elif method in http1.BODY_METHODS:
            fields.append((b"Content-Length", b"0"))
        fields.extend((k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items())
        self.sock.sendall(http1.request_head(method, target, fields) + (body or b""))

    def response(self, method: str) -> Response:
        """Read the status line and headers of the next answer (interim 1xx skipped)."""
        while True:
            line = self._reader.readline(http1.MAX_LINE + 1)
            if not line:
                raise RemoteDisconnected("the server closed the connection without answering")
            version, status, reason = http1.status_line(line)
            head = http1.Head()
            while not head.feed(self._reader.readline(http1.MAX_LINE + 1)):
                pass
            if 100 <= status < 200 and status != 101:
                continue
            return Response(
                self,
                http1.Framing(method, version, status, head.fields),
                status,
                reason,
                head.fields,
            )

    def read_line(self) -> bytes:
        """One line of a chunked body's framing."""
        return self._reader.readline(http1.MAX_LINE + 1)

    def read1(self, size: int) -> bytes:
        """Up to ``size`` bytes, as soon as any are there (at most one socket read)."""
        return self._reader.read1(size)

    def read_exact(self, size: int) -> bytes:
        """Exactly ``size`` bytes, or fewer if the connection ends first."""
        return self._reader.read(size)

    def close(self) -> None:
        """Close the socket; safe to call more than once."""
        self._reader.close()
        self.sock.close()


class Response:
    """An answer whose body is read whole (``read``) or piece by piece (``read1``)."""

    def __init__(
        self,
        conn: Connection,
        framing: http1.Framing,
        status: int,
        reason: str,
        headers: dict[str, str],
    ) -> None:
        self._conn = conn
        self.status = status
        self.reason = reason
        self.headers = headers
        self.will_close = not framing.keep_alive
        self._chunked = framing.chunked
        self._chunk_left = 0
        #: Bytes of the body still to come (None: chunked, or until the connection closes).
        self.length = framing.length
        self._done = self.length == 0

    @property
    def complete(self) -> bool:
        """The whole body was read by its framing (the connection may carry another)."""
        return self._done

    def read(self) -> bytes:
        """The rest of the body."""
        parts: list[bytes] = []
        while True:
            part = self.read1(64 * 1024)
            if not part:
                return b"".join(parts)
            parts.append(part)

    def read1(self, size: int) -> bytes:
        """Up to ``size`` bytes of the body as soon as they arrive; ``b""`` at its end."""
        if self._done:
            return b""
        if self._chunked:
            return self._read_chunk(size)
        if self.length is None:
            data = self._conn.read1(size)
            self._done = not data
            return data
        data = self._conn.read1(min(size, self.length))
        if not data:
            raise IncompleteRead()
        self.length -= len(data)
        self._done = self.length == 0
        return data

    def _read_chunk(self, size: int) -> bytes:
        if self._chunk_left == 0:
            self._chunk_left = http1.chunk_size(self._conn.read_line())
            if self._chunk_left == 0:
                head = http1.Head()  # the trailer: header lines, then a blank one
                while not head.feed(self._conn.read_line()):
                    pass
                self._done = True
                return b""
        data = self._conn.read1(min(size, self._chunk_left))
        if not data:
            raise IncompleteRead()
        self._chunk_left -= len(data)
        if self._chunk_left == 0 and self._conn.read_exact(2) != b"\r\n":
            raise IncompleteRead()
        return data

    def __repr__(self) -> str:
        return f"<Response {self.status} {self.reason}>"
