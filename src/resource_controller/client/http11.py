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
server has closed looks like, which the caller may retry once.
"""

from __future__ import annotations

import socket

#: As ``http.client``: the longest status or header line, and the most header lines.
MAX_LINE = 65536
MAX_HEADERS = 100

_NO_BODY_METHODS = frozenset({"HEAD"})
#: Methods that send ``Content-Length: 0`` when they carry no body (as ``http.client``).
_BODY_METHODS = frozenset({"PATCH", "POST", "PUT"})


class ProtocolError(Exception):
    """The server's answer is not HTTP/1.x the client can read."""


class IncompleteRead(ProtocolError):
    """The connection ended before the body its framing announced."""

    def __init__(self) -> None:
        super().__init__("the connection ended mid-response")


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
        lines = [f"{method} {target} HTTP/1.1".encode("ascii"), b"Host: " + self._host]
        lines.append(b"Accept-Encoding: identity")
        if body is not None:
            lines.append(b"Content-Length: %d" % len(body))
        elif method in _BODY_METHODS:
            lines.append(b"Content-Length: 0")
        lines.extend(f"{k}: {v}".encode("latin-1") for k, v in headers.items())
        self.sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + (body or b""))

    def response(self, method: str) -> Response:
        """Read the status line and headers of the next answer (interim 1xx skipped)."""
        while True:
            line = self._reader.readline(MAX_LINE + 1)
            if not line:
                raise RemoteDisconnected("the server closed the connection without answering")
            version, status, reason = _status_line(line)
            headers = self._headers()
            if 100 <= status < 200 and status != 101:
                continue
            return Response(self, method, version, status, reason, headers)

    def _headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        for _ in range(MAX_HEADERS + 1):
            line = self._reader.readline(MAX_LINE + 1)
            if len(line) > MAX_LINE:
                raise ProtocolError("header line too long")
            if line in (b"\r\n", b"\n", b""):
                return headers
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep:
                continue  # as lenient as http.client with a line that is no header
            key = name.strip().lower()
            text = value.strip()
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        raise ProtocolError(f"got more than {MAX_HEADERS} headers")

    def read_line(self) -> bytes:
        """One line of a chunked body's framing."""
        line = self._reader.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise ProtocolError("chunk size line too long")
        return line

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


def _status_line(line: bytes) -> tuple[int, int, str]:
    if len(line) > MAX_LINE:
        raise ProtocolError("status line too long")
    text = line.decode("latin-1")
    version, _, rest = text.partition(" ")
    code, _, reason = rest.partition(" ")
    if version not in ("HTTP/1.1", "HTTP/1.0") or len(code) != 3 or not code.isdigit():
        raise ProtocolError(repr(line))
    return (11 if version == "HTTP/1.1" else 10), int(code), reason.strip()


class Response:
    """An answer whose body is read whole (``read``) or piece by piece (``read1``)."""

    def __init__(
        self,
        conn: Connection,
        method: str,
        version: int,
        status: int,
        reason: str,
        headers: dict[str, str],
    ) -> None:
        self._conn = conn
        self.status = status
        self.reason = reason
        self.headers = headers
        tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        self.will_close = "close" in tokens or (version == 10 and "keep-alive" not in tokens)
        self._chunked = False
        self._chunk_left = 0
        self._done = True
        #: Bytes of the body still to come (None: until the connection closes).
        self.length: int | None = 0
        if method in _NO_BODY_METHODS or status in (204, 304) or status < 200:
            return
        self._done = False
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._chunked = True
            self.length = None
            return
        length = headers.get("content-length")
        if length is None:
            self.length = None
            self.will_close = True  # the body ends where the connection does
            return
        try:
            self.length = int(length.split(",")[0].strip())
        except ValueError:
            raise ProtocolError(f"bad Content-Length {length!r}") from None
        if self.length < 0:
            raise ProtocolError(f"bad Content-Length {length!r}")
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
            line = self._conn.read_line()
            if not line:
                raise IncompleteRead()
            try:
                self._chunk_left = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size line {line!r}") from None
            if self._chunk_left == 0:
                self._trailer()
                return b""
        data = self._conn.read1(min(size, self._chunk_left))
        if not data:
            raise IncompleteRead()
        self._chunk_left -= len(data)
        if self._chunk_left == 0 and self._conn.read_exact(2) != b"\r\n":
            raise IncompleteRead()
        return data

    def _trailer(self) -> None:
        for _ in range(MAX_HEADERS + 1):
            line = self._conn.read_line()
            if not line:
                raise IncompleteRead()
            if line in (b"\r\n", b"\n"):
                self._done = True
                return
        raise ProtocolError("chunked trailer too long")

    def __repr__(self) -> str:
        return f"<Response {self.status} {self.reason}>"
