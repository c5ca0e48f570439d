"""Synchronous HTTP to the controller: the blocking shell of ``h1`` with routes, errors, fail-over.

``rc run -- true`` is on people's hot path, so the connection is ``h1.blocking``'s plain
socket (not ``http.client``, which loads ``email`` and ``ssl``): one kept-alive
connection, which a long-lived stream (log follow) borrows and gives back once the
stream has ended cleanly, so that ``rc run``'s submit, follow and final poll share one
connection; and a timeout chosen per request, because only the callers know what is
bounded (CLI-070: no overall timeout; the polling loops bound each poll themselves).
A request made while a stream holds the connection opens another.

Every failure leaves here as one of two errors from ``errors``:

- ``ApiError``: the controller answered non-2xx. Its ``{"error", "message"}`` body
  becomes ``<code>: <message>``, raised as that code's class (``errors.API_CODES``); anything else becomes "controller returned
  <status> <reason>".
- ``TransportError``: no usable answer (one of its kinds: refused, DNS, reset, timed
  out), naming the request and the cause.

Nothing here retries a request the controller may have seen. The one exception to
"never resend" is a request that failed on a kept-alive connection the controller
had already closed while idle (``Disconnected`` on a reused connection): such a
request never reached it, so it is sent once more on a fresh connection. Several
comma-separated base URLs fail over to the next one only when a connection cannot be
opened at all.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping

from resource_controller import errors
from resource_controller.client import urls
from resource_controller.h1 import blocking, core

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from typing import Any, NamedTuple
else:
    from resource_controller.client.records import NamedTuple

#: Bound on connecting when the request sets none: an unanswered SYN never hangs ``rc``.
CONNECT_TIMEOUT = 30.0


class Response(NamedTuple):
    """A complete 2xx answer (a named tuple: ``dataclasses`` costs start-up time)."""

    status: int
    body: bytes
    #: ``METHOD URL`` of the request, for error messages about this response.
    request: str

    def json(self) -> Any:
        """The body as JSON; a 2xx that is not JSON is a protocol failure."""
        try:
            return json.loads(self.body)
        except ValueError as e:
            raise errors.TransportError(
                f"{self.request}: controller sent a malformed JSON body ({e})"
            ) from e


class _Base(NamedTuple):
    """One controller base URL, taken apart once."""

    url: str
    end: core.Endpoint


def _parse_base(url: str) -> _Base:
    try:
        parts = urls.split(url)
    except ValueError as e:
        raise errors.TransportError(f"controller URL {url!r}: {e}") from e
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise errors.TransportError(
            f"controller URL {url!r} is not an http:// or https:// URL (check RC_CONTROLLER)"
        )
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return _Base(url, core.Endpoint(parts.scheme, parts.hostname, port, parts.path.rstrip("/")))


def api_error(status: int, reason: str, body: bytes, missing_token: str = "") -> errors.ApiError:
    """Map a non-2xx answer onto ``ApiError``.

    ``missing_token`` says where the client looked for a token it did not find; it is
    added to an ``unauthorized`` answer, the one a missing token earns.
    """
    code, message = core.error_body(body)
    if code:
        if missing_token and code == "unauthorized":
            message = f"{message}; {missing_token}" if message else missing_token
        return errors.api_error(code, message, status)
    if not reason:
        import http  # only for an answer without a reason phrase

        try:
            reason = http.HTTPStatus(status).phrase
        except ValueError:
            reason = ""
    return errors.ApiError("", f"controller returned {status} {reason}".rstrip(), status)


class Stream:
    """An open 2xx response read chunk by chunk; iterate for ``bytes``, then ``close``.

    A stream that ends by its framing hands its connection to ``keep`` for the next
    request; one closed early, or broken, drops it.
    """

    def __init__(
        self,
        conn: blocking.Connection,
        request: str,
        keep: Callable[[blocking.Connection], None] | None = None,
    ) -> None:
        self._conn: blocking.Connection | None = conn
        self._keep = keep
        self.request = request

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        if self._conn is None:
            raise StopIteration
        try:
            chunk = self._conn.read()
        except errors.TransportError as e:
            self.close()
            raise type(e)(f"{self.request}: {e}") from e
        except BaseException:
            self.close()
            raise
        if chunk:
            return chunk
        conn, self._conn = self._conn, None
        if self._keep is not None:
            self._keep(conn)
        else:
            conn.close()
        raise StopIteration

    def close(self) -> None:
        """Drop the connection unless the stream ended and gave it back; idempotent."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Transport:
    """Requests to one controller (or a fail-over list of them) with a bearer token."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        origin: str = "",
        missing_token: Callable[[], str] | None = None,
        opener: blocking.Opener = blocking.open_socket,
    ) -> None:
        """``origin`` says where ``base_url`` came from (``from RC_CONTROLLER``, ...); an
        error that the controller cannot be reached names it.
        ``missing_token``, asked only when an empty token is refused, says where the
        client looked for one (``config.Settings.missing_token``). ``opener`` makes the
        connections' sockets (tests put a fake controller there)."""
        self._origin = origin
        self._missing_token = missing_token
        self._opener = opener
        urls = [u.strip().rstrip("/") for u in base_url.split(",")]
        urls = [u for u in urls if u] or [base_url]
        self._bases = [_parse_base(u) for u in urls]
        self._current = 0
        self._token = token
        self._conn: blocking.Connection | None = None
        # Both headers on every request, even with an empty token, so the controller
        # answers "unauthorized" instead of the client guessing.
        self._fields = [
            (b"Authorization", core.bearer(token).encode("latin-1")),
            (b"Content-Type", b"application/json"),
            (b"Accept-Encoding", b"identity"),
        ]

    @property
    def base_url(self) -> str:
        """The base URL requests currently go to."""
        return self._bases[self._current].url

    @property
    def token(self) -> str:
        """The bearer token (for streams this transport does not carry, the relay)."""
        return self._token

    def _target(self, base: _Base, path: str, query: Mapping[str, str] | None) -> str:
        target = base.end.prefix + path
        if query:
            target += "?" + urls.urlencode(sorted(query.items()))
        return target

    def _open(self, timeout: float | None, request: str) -> blocking.Connection:
        """Open a connection, failing over between base URLs only when connecting fails."""
        first_error: errors.ConnectFailed | None = None
        bound = CONNECT_TIMEOUT if timeout is None else timeout
        for step in range(len(self._bases)):
            index = (self._current + step) % len(self._bases)
            try:
                conn = blocking.Connection(self._bases[index].end, bound, self._opener)
            except errors.ConnectFailed as e:
                first_error = first_error or e
                continue
            self._current = index
            return conn
        assert first_error is not None
        message = f"{request}: {first_error}"
        if self._origin:
            urls = ", ".join(b.url for b in self._bases)
            plural = "s" if len(self._bases) > 1 else ""
            message += f" (controller{plural} {urls} {self._origin})"
        raise errors.ConnectFailed(message) from first_error

    def _refusal(self, head: core.Head, data: bytes) -> errors.ApiError:
        """The error for a non-2xx answer, saying where a missing token was looked for."""
        hint = ""
        if not self._token and self._missing_token is not None and head.status == 401:
            hint = self._missing_token()
        return api_error(head.status, head.reason, data, hint)

    def _describe(self, method: str, path: str, query: Mapping[str, str] | None) -> str:
        base = self._bases[self._current]
        return f"{method} {base.url}{path}" + (
            "?" + urls.urlencode(sorted(query.items())) if query else ""
        )

    def _take(self, timeout: float | None, request: str) -> blocking.Connection:
        """The kept-alive connection or a new one, bounded by ``timeout``."""
        conn = self._conn
        self._conn = None
        if conn is None:
            conn = self._open(timeout, request)
        conn.settimeout(timeout)
        return conn

    def _keep(self, conn: blocking.Connection) -> None:
        """Keep ``conn`` for the next request if its answer was read whole and it stays open."""
        if self._conn is None and conn.recycle():
            self._conn = conn
        else:
            conn.close()

    def _exchange(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None,
        payload: bytes | None,
        timeout: float | None,
        *,
        whole: bool,
    ) -> tuple[blocking.Connection, core.Head, bytes, str]:
        """Send one request and read the answer's head (and, if ``whole``, its body).

        A kept-alive connection the controller closed while idle fails before the
        request reached it: the request is then sent once more, on a new connection.
        """
        request = self._describe(method, path, query)
        for attempt in (0, 1):
            conn = self._take(timeout, request)
            request = self._describe(method, path, query)
            target = self._target(self._bases[self._current], path, query)
            try:
                head = conn.request(method, target, self._fields, payload)
                data = conn.read_all() if whole or not 200 <= head.status < 300 else b""
            except errors.Disconnected as e:
                conn.close()
                if conn.reused and attempt == 0:
                    continue
                raise errors.Disconnected(f"{request}: {e}") from e
            except errors.TransportError as e:
                conn.close()
                raise type(e)(f"{request}: {e}") from e
            except BaseException:
                conn.close()
                raise
            return conn, head, data, request
        raise AssertionError("unreachable")  # pragma: no cover

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        timeout: float | None = None,
    ) -> Response:
        """Send one request and read the whole answer; raise unless it is 2xx.

        ``body`` is serialised as JSON when not ``None``. ``timeout`` bounds connecting
        and each socket read; ``None`` waits as long as it takes (connecting, at most
        ``CONNECT_TIMEOUT``).
        """
        payload = None if body is None else json.dumps(body).encode()
        conn, head, data, request = self._exchange(
            method, path, query, payload, timeout, whole=True
        )
        self._keep(conn)
        if head.status >= 500 and self._fail_over() and method == "GET":
            # Another controller of the list may answer; a read is safe to repeat.
            conn, head, data, request = self._exchange(
                method, path, query, payload, timeout, whole=True
            )
            self._keep(conn)
        if not 200 <= head.status < 300:
            raise self._refusal(head, data)
        return Response(head.status, data, request)

    def stream(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Stream:
        """Open a long-lived response, on the kept-alive connection if there is one.

        The status is checked before returning, so a refusal (``not_found``,
        ``logs_not_stored``) raises here rather than while iterating. ``timeout``
        bounds connecting and each read, the idle time between two pieces too.
        """
        conn, head, data, request = self._exchange(method, path, query, None, timeout, whole=False)
        if not 200 <= head.status < 300:
            self._keep(conn)
            raise self._refusal(head, data)
        return Stream(conn, request, self._keep)

    def _fail_over(self) -> bool:
        """Send the next requests to the next controller of the list (after a 5xx: that
        one cannot serve now); False when there is no other."""
        if len(self._bases) < 2:
            return False
        self.close()
        self._current = (self._current + 1) % len(self._bases)
        return True

    def close(self) -> None:
        """Close the kept-alive connection, if any."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
