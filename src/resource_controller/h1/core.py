"""HTTP/1.1 without I/O, on h11: what a shell writes and how it reads what comes back.

A shell writes what a ``Wire``'s ``start``, ``write`` and ``finish`` return, ``feed``s it
what it reads and takes from ``next`` the ``Head``, the body's pieces, then ``END``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import h11

from resource_controller import errors

MAX_HEAD = 65536
#: Methods that send ``Content-Length: 0`` when they carry no body (as ``http.client``).
BODY_METHODS = frozenset({"PATCH", "POST", "PUT"})
END = b""


class Endpoint(NamedTuple):
    """Where one base URL's requests go: the connection and the path prefix."""

    scheme: str
    host: str
    port: int
    prefix: str

    @property
    def tls(self) -> bool:
        return self.scheme == "https"

    @property
    def authority(self) -> bytes:
        """The ``Host`` header: the port only when it is not the scheme's default."""
        name = f"[{self.host}]" if ":" in self.host else self.host
        text = name if self.port == (443 if self.tls else 80) else f"{name}:{self.port}"
        try:
            return text.encode("ascii")
        except UnicodeEncodeError:
            return text.encode("idna")


def endpoint(url: str) -> Endpoint:
    """``url``'s endpoint; ``ValueError`` saying what is wrong with it."""
    import urllib.parse  # not for rc, whose client splits its URL itself

    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http:// or https:// URL")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise ValueError(f"{url!r}: {exc}") from None
    return Endpoint(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))


def bearer(token: str) -> str:
    """Sent even for no token, so that the controller answers ``unauthorized``."""
    return f"Bearer {token}" if token else "Bearer"


class Head(NamedTuple):
    """An answer's status and headers (names lowercased, repeated fields joined)."""

    status: int
    reason: str
    headers: dict[str, str]


def cause(exc: BaseException) -> str:
    """A short, human reason for a failed read, write or connect."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    import socket

    if isinstance(exc, socket.gaierror):
        return f"cannot resolve host: {exc.strerror or exc}"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[:1].lower() + exc.strerror[1:]
    return str(exc) or type(exc).__name__


class Wire:
    """One connection's HTTP/1.1 state: requests one after another, each answer read."""

    __slots__ = ("_answered", "_closed", "_h11", "_host")

    def __init__(self, authority: bytes) -> None:
        self._h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
        self._host = authority
        self._answered = False
        self._closed = False

    @property
    def answered(self) -> bool:
        """Some of the current answer has arrived (a failure now loses an answer)."""
        return self._answered

    def start(
        self,
        method: str,
        target: str,
        fields: list[tuple[bytes, bytes]],
        body: bytes | None = None,
        *,
        open_body: bool = False,
    ) -> bytes:
        """The request; with ``open_body``, a chunked body ``write`` and ``finish`` send."""
        headers = [(b"Host", self._host), *fields]
        if open_body:
            headers.append((b"Transfer-Encoding", b"chunked"))
        elif body is not None or method in BODY_METHODS:
            headers.append((b"Content-Length", b"%d" % len(body or b"")))
        self._answered = False
        send = self._h11.send
        try:
            request = h11.Request(method=method, target=target, headers=headers)
        except h11.LocalProtocolError:
            # Never h11's text: it quotes the value, which may be a token.
            raise errors.TransportError(
                f"{method} {target}: a header name or value is not legal in HTTP"
            ) from None
        out = send(request) or b""
        if body:
            out += send(h11.Data(data=body)) or b""
        if not open_body:
            out += send(h11.EndOfMessage()) or b""
        return out

    def write(self, data: bytes) -> bytes:
        """One chunk of an open request body, framed."""
        return self._h11.send(h11.Data(data=data)) or b""

    def finish(self) -> bytes:
        """The end of an open request body; nothing when it has ended already."""
        if self._h11.our_state is not h11.SEND_BODY:
            return b""
        return self._h11.send(h11.EndOfMessage()) or b""

    def feed(self, data: bytes) -> None:
        """Bytes read from the connection; ``b""`` when it ended."""
        if data:
            self._answered = True
        elif not self._answered:
            raise errors.Disconnected("the controller closed the connection without answering")
        else:
            self._closed = True
        self._h11.receive_data(data)

    def next(self) -> Head | bytes | None:
        """The ``Head``, each piece of the body, then ``END``; ``None``: read more first."""
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as exc:
                if "closed" in str(exc):
                    raise errors.AnswerLost(
                        "the controller closed the connection mid-response"
                    ) from None
                raise errors.AnswerLost(f"unreadable answer: {exc}") from None
            if event is h11.NEED_DATA:
                return None
            if isinstance(event, h11.Response):
                fields: dict[str, str] = {}
                for raw_name, raw_value in event.headers:
                    name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
                    known = fields.get(name)
                    fields[name] = value if known is None else f"{known}, {value}"
                return Head(event.status_code, event.reason.decode("latin-1"), fields)
            if isinstance(event, h11.Data):
                return bytes(event.data)
            if isinstance(event, h11.EndOfMessage):
                return END
            if isinstance(event, h11.InformationalResponse):
                continue
            # PAUSED or ConnectionClosed: nothing more of this answer will come.
            return END

    def recycle(self) -> bool:
        """Ready for another request if both messages ended; False means close it."""
        wire = self._h11
        done = wire.our_state is h11.DONE and wire.their_state is h11.DONE
        if self._closed or not done:  # closed: an answer framed by the end of the connection
            return False
        wire.start_next_cycle()
        return True


def error_body(body: bytes) -> tuple[str, str]:
    """The ``{"error": code, "message": text}`` of an error answer; blanks when absent."""
    import json

    try:
        data = json.loads(body) if body else None
    except ValueError:
        return "", ""
    if not isinstance(data, dict):
        return "", ""
    code, message = data.get("error"), data.get("message")
    return (code if isinstance(code, str) else ""), (message if isinstance(message, str) else "")


def proxy_refusal(end: Endpoint, environ: Mapping[str, str]) -> str:
    """Why a proxy set in ``environ`` (unless ``NO_PROXY`` names the host) cannot carry
    requests to ``end``: none is supported, so the process refuses rather than connect."""
    names = ("https_proxy" if end.tls else "http_proxy", "all_proxy")
    given = [v for n in names for v in (n.upper(), n) if environ.get(v)]
    if not given:
        return ""
    skip = (environ.get("NO_PROXY") or environ.get("no_proxy") or "").lower()
    host = end.host.lower()
    for entry in (e.strip().lstrip(".") for e in skip.split(",")):
        name = entry.rsplit(":", 1)[0] if entry.count(":") == 1 else entry
        if entry == "*" or (name and (host == name or host.endswith("." + name))):
            return ""
    return (
        f"{given[0]} is set, but {end.host} is reached directly (no proxy is supported):"
        f" unset {given[0]}, or add {end.host} to NO_PROXY"
    )
