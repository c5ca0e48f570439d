"""HTTP/1.1 messages without I/O: how a request head is written and an answer is read.

Three connections speak HTTP/1.1 themselves: the command line's blocking client
(``client/http11.py``, which must start faster than an HTTP library imports), the
asyncio exchanges under the worker's requests and the asynchronous client's httpx
(``streams11.py``), and the relay's full-duplex streams (``duplex.py``). Each owns only
its reads and writes; the rules of the format — what a status line, a header line and a
chunk-size line may look like, how an answer's body is framed, whether the connection
may carry another request, what an error body says — live here once, so the three
cannot disagree. Standard library only, and nothing that slows ``rc``'s start.
"""

from __future__ import annotations

import json

#: As ``http.client``: the longest status, header or chunk-size line, and the most
#: header lines in one head.
MAX_LINE = 65536
MAX_HEADERS = 100
#: Answers that carry no body whatever their headers say (RFC 9112 §6.3).
NO_BODY_STATUSES = frozenset({204, 304})
#: Methods that send ``Content-Length: 0`` when they carry no body (as ``http.client``).
BODY_METHODS = frozenset({"PATCH", "POST", "PUT"})


class ProtocolError(Exception):
    """The peer's answer is not HTTP/1.x that can be read."""


class IncompleteRead(ProtocolError):
    """The connection ended before the body its framing announced."""

    def __init__(self) -> None:
        super().__init__("the connection ended mid-response")


def request_head(method: str, target: str, headers: list[tuple[bytes, bytes]]) -> bytes:
    """The request line and header lines, ending with the blank line."""
    lines = [f"{method} {target} HTTP/1.1".encode("latin-1")]
    lines.extend(name + b": " + value for name, value in headers)
    lines.append(b"\r\n")
    return b"\r\n".join(lines)


def status_line(line: bytes) -> tuple[int, int, str]:
    """``(version, status, reason)`` of a status line: version 11 or 10."""
    if not line:
        raise ProtocolError("the server closed the connection without answering")
    if len(line) > MAX_LINE:
        raise ProtocolError("status line too long")
    text = line.decode("latin-1").rstrip("\r\n")
    version, _, rest = text.partition(" ")
    code, _, reason = rest.partition(" ")
    if version not in ("HTTP/1.1", "HTTP/1.0") or len(code) != 3 or not code.isdigit():
        raise ProtocolError(f"malformed status line {line[:80]!r}")
    return (11 if version == "HTTP/1.1" else 10), int(code), reason.strip()


class Head:
    """An answer's header lines, fed one at a time until the blank line ends them.

    ``fields`` has the names lowercased, repeated fields joined with ``, ``;
    ``raw`` keeps every name and value as sent, in bytes (what httpx takes as is).
    """

    __slots__ = ("fields", "raw")

    def __init__(self) -> None:
        self.fields: dict[str, str] = {}
        self.raw: list[tuple[bytes, bytes]] = []

    def feed(self, line: bytes) -> bool:
        """Take one line; True once the head is complete."""
        if line in (b"\r\n", b"\n"):
            return True
        if len(line) > MAX_LINE:
            raise ProtocolError("header line too long")
        if not line.endswith(b"\n"):
            raise ProtocolError("the connection closed inside the headers")
        if len(self.raw) >= MAX_HEADERS:
            raise ProtocolError(f"got more than {MAX_HEADERS} headers")
        raw_name, colon, raw_value = line.partition(b":")
        raw_name, raw_value = raw_name.strip(), raw_value.strip()
        if not colon or not raw_name:
            raise ProtocolError(f"malformed header line {line[:80]!r}")
        self.raw.append((raw_name, raw_value))
        key = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        known = self.fields.get(key)
        self.fields[key] = value if known is None else f"{known}, {value}"
        return False


class Framing:
    """How an answer's body ends, and whether its connection may carry another request.

    ``length`` is the body's size when ``Content-Length`` (or the rules) fix it, and
    ``None`` when it is chunked or runs to the end of the connection.
    """

    __slots__ = ("chunked", "keep_alive", "length")

    def __init__(self, method: str, version: int, status: int, fields: dict[str, str]) -> None:
        tokens = {t.strip().lower() for t in fields.get("connection", "").split(",")}
        self.keep_alive = "close" not in tokens and (version == 11 or "keep-alive" in tokens)
        self.chunked = False
        self.length: int | None = 0
        if method == "HEAD" or status in NO_BODY_STATUSES or status < 200:
            return
        if "chunked" in fields.get("transfer-encoding", "").lower():
            self.chunked = True
            self.length = None
            return
        text = fields.get("content-length")
        if text is None:
            self.length = None
            self.keep_alive = False  # the body ends where the connection does
            return
        try:
            length = int(text.split(",")[0].strip())
        except ValueError:
            raise ProtocolError(f"malformed Content-Length {text!r}") from None
        if length < 0:
            raise ProtocolError(f"malformed Content-Length {text!r}")
        self.length = length


def chunk_size(line: bytes) -> int:
    """The size a chunk-size line announces (extensions ignored); 0 ends the body."""
    if not line:
        raise IncompleteRead()
    if len(line) > MAX_LINE:
        raise ProtocolError("chunk-size line too long")
    try:
        size = int(line.split(b";", 1)[0].strip(), 16)
    except ValueError:
        raise ProtocolError(f"malformed chunk-size line {line[:80]!r}") from None
    if size < 0:
        raise ProtocolError(f"malformed chunk-size line {line[:80]!r}")
    return size


def error_body(body: bytes) -> tuple[str, str]:
    """The ``{"error": code, "message": text}`` of an error answer; blanks when absent."""
    try:
        data = json.loads(body) if body else None
    except ValueError:
        return "", ""
    if not isinstance(data, dict):
        return "", ""
    code, message = data.get("error"), data.get("message")
    return (code if isinstance(code, str) else ""), (message if isinstance(message, str) else "")
