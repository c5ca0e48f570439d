"""Synchronous HTTP to the controller over ``h1.blocking``'s plain socket (``http.client``
loads ``email`` and ``ssl``, too slow for ``rc run``), with one kept-alive connection.

Every request is bounded, since a frozen controller can keep connections open. With
several base URLs (EXT-PG-5), a request with no answer or a 5xx goes to the next one
when ``Call.resend`` says it is safe; one that could not connect always does.
"""

from __future__ import annotations

import json

from resource_controller import errors
from resource_controller.client import urls
from resource_controller.h1 import blocking, core

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping
    from typing import Any, NamedTuple

    from resource_controller.client.calls import Call
else:
    from resource_controller.client.records import NamedTuple

REQUEST_BOUND = 5.0


class _Base(NamedTuple):
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


class Bases:
    """The controllers of a comma-separated ``RC_CONTROLLER``, and which one is current."""

    def __init__(
        self,
        base_url: str,
        origin: str = "",
        missing_token: Callable[[], str] | None = None,
        token: str = "",
    ) -> None:
        listed = [u.strip().rstrip("/") for u in base_url.split(",")]
        self.bases = [_parse_base(u) for u in [u for u in listed if u] or [base_url]]
        self.current = 0
        self.origin = origin
        self.missing_token = missing_token
        self.token = token
        # Both on every request, even with an empty token, so the controller answers
        # "unauthorized" instead of the client guessing.
        self.headers = {"Authorization": core.bearer(token), "Content-Type": "application/json"}

    @property
    def url(self) -> str:
        return self.bases[self.current].url

    def tries(self, call: Call) -> Tries:
        return Tries(self, call)

    def target(self, index: int, path: str, query: Mapping[str, str] | None) -> tuple[str, str]:
        suffix = "?" + urls.urlencode(sorted(query.items())) if query else ""
        base = self.bases[index]
        return base.end.prefix + path + suffix, base.url + path + suffix

    def unreachable(self, request: str, exc: errors.ConnectFailed) -> errors.ConnectFailed:
        message = f"{request}: {exc}"
        if self.origin:
            plural = "s" if len(self.bases) > 1 else ""
            listed = ", ".join(b.url for b in self.bases)
            message += f" (controller{plural} {listed} {self.origin})"
        return errors.ConnectFailed(message)

    def refusal(self, status: int, reason: str, body: bytes, token: str) -> errors.ApiError:
        code, message = core.error_body(body)
        if code:
            if code == "unauthorized" and not token and self.missing_token is not None:
                hint = self.missing_token()
                message = f"{message}; {hint}" if message and hint else message or hint
            return errors.api_error(code, message, status)
        if not reason:
            import http  # only for an answer without a reason phrase

            try:
                reason = http.HTTPStatus(status).phrase
            except ValueError:
                reason = ""
        return errors.ApiError("", f"controller returned {status} {reason}".rstrip(), status)


class Tries:
    """The fail-over rule: iterate for the next base; ``failed``/``answered`` raise to stop."""

    def __init__(self, bases: Bases, call: Call) -> None:
        self.bases, self.call = bases, call
        self.payload = None if call.body is None else json.dumps(call.body).encode()
        self.bound = REQUEST_BOUND if call.timeout is None else call.timeout
        n = len(bases.bases)
        self.order = [(bases.current + step) % n for step in range(n)]
        self.step = 0
        self.unreached: errors.ConnectFailed | None = None
        self.last: errors.ClientError | None = None

    def __iter__(self) -> Iterator[int]:
        for step, index in enumerate(self.order):
            self.step = step
            yield index
        if self.last is not None:
            raise self.last
        assert self.unreached is not None
        call = self.call
        raise self.bases.unreachable(f"{call.method} {self.bases.url}{call.path}", self.unreached)

    def _resend(self, error: errors.ClientError) -> None:
        if not (self.call.resend and self.step < len(self.order) - 1):
            raise error
        self.last = error

    def failed(self, error: errors.TransportError) -> None:
        if isinstance(error, errors.ConnectFailed):
            self.unreached = self.unreached or error
        else:
            self._resend(error)

    def answered(self, index: int, status: int, reason: str, body: bytes) -> bool:
        """True for a 2xx; False when a 5xx sends this request on."""
        self.bases.current = index
        if 200 <= status < 300:
            return True
        refusal = self.bases.refusal(status, reason, body, self.bases.token)
        if status < 500 or len(self.order) < 2:
            raise refusal
        # This controller cannot serve now: the next one takes the next requests.
        self.bases.current = self.order[(self.step + 1) % len(self.order)]
        self._resend(refusal)
        return False


def decode(body: bytes, request: str) -> Any:
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError as e:
        raise errors.TransportError(
            f"{request}: controller sent a malformed JSON body ({e})"
        ) from e


class Stream:
    """An open 2xx answer; one that ends by its framing gives its connection back to ``keep``."""

    def __init__(
        self,
        conn: blocking.Connection,
        request: str,
        base: str,
        keep: Callable[[blocking.Connection], None],
    ) -> None:
        self._conn: blocking.Connection | None = conn
        self._keep = keep
        self.request = request
        self.base = base

    def read(self, idle: float | None = None) -> bytes | None:
        conn = self._conn
        if conn is None:
            return b""
        conn.settimeout(idle)
        try:
            chunk = conn.read()
        except errors.TimedOut:
            if idle is None:
                raise
            return None
        except BaseException as e:
            self.close()
            if isinstance(e, errors.TransportError):
                raise type(e)(f"{self.request}: {e}") from e
            raise
        if not chunk:
            self._conn = None
            self._keep(conn)
        return chunk

    def __iter__(self) -> Iterator[bytes]:
        while chunk := self.read():
            yield chunk

    def close(self) -> None:
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
        self.bases = Bases(base_url, origin, missing_token, token)
        self._opener = opener
        self.token = token
        self._conn: tuple[int, blocking.Connection] | None = None
        fields = {**self.bases.headers, "Accept-Encoding": "identity"}
        self._fields = [(k.encode(), v.encode("latin-1")) for k, v in fields.items()]

    @property
    def base_url(self) -> str:
        return self.bases.url

    def _keep(self, index: int) -> Callable[[blocking.Connection], None]:
        def keep(conn: blocking.Connection) -> None:
            if self._conn is None and conn.recycle():
                self._conn = (index, conn)
            else:
                conn.close()

        return keep

    def _exchange(
        self, index: int, call: Call, tries: Tries, *, whole: bool
    ) -> tuple[blocking.Connection, core.Head, bytes, str]:
        payload, bound = tries.payload, tries.bound
        target, request = self.bases.target(index, call.path, call.query)
        request = f"{call.method} {request}"
        for attempt in (0, 1):
            kept, self._conn = self._conn, None
            if kept is not None and kept[0] == index:
                conn = kept[1]
            else:
                if kept is not None:
                    kept[1].close()
                conn = blocking.Connection(self.bases.bases[index].end, bound, self._opener)
            conn.settimeout(bound)
            try:
                head = conn.request(call.method, target, self._fields, payload)
                data = conn.read_all() if whole or not 200 <= head.status < 300 else b""
            except BaseException as e:
                conn.close()
                if isinstance(e, errors.Disconnected) and conn.reused and attempt == 0:
                    continue  # closed while idle: this request never reached it
                if isinstance(e, errors.TransportError):
                    raise type(e)(f"{request}: {e}") from e
                raise
            return conn, head, data, request
        raise AssertionError("unreachable")  # pragma: no cover

    def _send(self, call: Call, *, whole: bool) -> tuple[blocking.Connection, bytes, str]:
        tries = self.bases.tries(call)
        for index in tries:
            try:
                conn, head, data, request = self._exchange(index, call, tries, whole=whole)
            except errors.TransportError as e:
                tries.failed(e)
                continue
            if not 200 <= head.status < 300:
                self._keep(index)(conn)
            if tries.answered(index, head.status, head.reason, data):
                return conn, data, request
        raise AssertionError("unreachable")  # pragma: no cover

    def request(self, call: Call) -> Any:
        conn, data, request = self._send(call, whole=True)
        self._keep(self.bases.current)(conn)
        return call.answer(decode(data, request), request)

    def stream(self, call: Call) -> Stream:
        """A refusal raises here rather than while reading."""
        conn, _data, request = self._send(call, whole=False)
        return Stream(conn, request, self.bases.url, self._keep(self.bases.current))

    def close(self) -> None:
        if self._conn is not None:
            self._conn[1].close()
            self._conn = None
