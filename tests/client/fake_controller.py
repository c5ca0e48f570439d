"""A scripted controller behind the blocking client's connection opener.

``rc``'s own transport (``client/transport.py`` on ``h1.blocking``) runs unchanged: the
opener hands it a fake socket, and the fake reads each request with h11's server side
and answers what ``reply(method, path, kw)`` says, synchronously, with no thread and
no port. ``kw`` holds the request's JSON ``body``, its ``query`` and the ``timeout``
the socket had when the request came. ``reply`` answers with JSON (a 200), an
``ApiError`` (its status and error body), an iterator of byte chunks (a chunked
stream, read one chunk per ``recv``; a ``TransportError`` raised by it cuts the
connection mid-body) or a ``TransportError``, raised or returned (the connection
closes unanswered, and a retry's connection is refused).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import h11

from resource_controller import errors
from resource_controller.h1 import core

Reply = Callable[[str, str, dict[str, Any]], Any]


class FakeController:
    """Answers from ``reply``; ``calls`` records every request in order."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.refuse_next = False

    def open(self, end: core.Endpoint, timeout: float | None) -> FakeSocket:
        if self.refuse_next:
            self.refuse_next = False
            raise ConnectionRefusedError(111, "Connection refused")
        return FakeSocket(self, timeout)


class FakeSocket:
    """What the blocking shell reads and writes: one connection to the fake."""

    def __init__(self, ctl: FakeController, timeout: float | None) -> None:
        self._ctl = ctl
        self._h11 = h11.Connection(h11.SERVER)
        self._out = bytearray()
        self._stream: Iterator[bytes] | None = None
        self._closed = False
        self._timeout = timeout
        self._head: h11.Request | None = None
        self._body = bytearray()
        self._served = 0

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def sendall(self, data: bytes) -> None:
        if self._closed:
            raise BrokenPipeError(32, "Broken pipe")
        self._h11.receive_data(data)
        while (event := self._h11.next_event()) is not h11.NEED_DATA:
            if isinstance(event, h11.Request):
                self._head, self._body = event, bytearray()
            elif isinstance(event, h11.Data):
                self._body += event.data
            elif isinstance(event, h11.EndOfMessage):
                self._answer()
                break

    def _answer(self) -> None:
        assert self._head is not None
        url = urlsplit(self._head.target.decode())
        kw = {
            "body": json.loads(self._body) if self._body else None,
            "query": dict(parse_qsl(url.query)) or None,
            "timeout": self._timeout,
        }
        method = self._head.method.decode()
        self._ctl.calls.append((method, url.path, kw))
        self._served += 1
        try:
            value = self._ctl.reply(method, url.path, kw)
        except errors.RcError as exc:
            value = exc
        if isinstance(value, errors.TransportError):
            # No answer; on a kept-alive connection the client tries once more, on a new
            # one, and finds nobody listening: one failure either way.
            self._closed = True
            self._ctl.refuse_next = self._served > 1
        elif isinstance(value, errors.ApiError):
            given = "" if value.message == (type(value).__doc__ or "").strip() else value.message
            body = json.dumps({"error": value.code, "message": given}).encode()
            self._send(value.status, [("Content-Length", str(len(body)))], body)
        elif isinstance(value, (dict, list)):
            body = json.dumps(value).encode()
            self._send(200, [("Content-Length", str(len(body)))], body)
        else:
            self._send(200, [("Transfer-Encoding", "chunked")], None)
            self._stream = iter(value)

    def _send(self, status: int, headers: list[tuple[str, str]], body: bytes | None) -> None:
        self._out += self._h11.send(h11.Response(status_code=status, headers=headers)) or b""
        if body is not None:
            self._out += self._h11.send(h11.Data(data=body)) or b""
            self._out += self._h11.send(h11.EndOfMessage()) or b""
            self._h11.start_next_cycle()

    def recv(self, size: int) -> bytes:
        if not self._out and self._stream is not None and not self._closed:
            try:
                while not (piece := next(self._stream)):
                    pass
                self._out += self._h11.send(h11.Data(data=piece)) or b""
            except StopIteration:
                self._stream = None
                self._out += self._h11.send(h11.EndOfMessage()) or b""
                self._h11.start_next_cycle()
            except errors.TransportError:
                self._closed = True  # cut mid-body
        piece = bytes(self._out[:size])
        del self._out[:size]
        return piece

    def close(self) -> None:
        self._closed = True
