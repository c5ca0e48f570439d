"""The asyncio client's HTTP: ``h1.aio`` as the worker's, the same routes, errors and fail-over as ``transport``.

Kept apart from ``aio`` so that the async client's methods and its connection handling
each fit one reading; the sync ``transport`` is the model for both behaviours.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from resource_controller import errors
from resource_controller.client import transport
from resource_controller.h1 import aio, core

#: Bound on connecting when the request sets none.
CONNECT_TIMEOUT = transport.CONNECT_TIMEOUT


class AsyncTransport:
    """Requests to one controller (or a fail-over list) with a bearer token."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        origin: str = "",
        missing_token: Callable[[], str] | None = None,
        connect: aio.Connect = aio.open_tcp,
    ) -> None:
        urls = [u.strip().rstrip("/") for u in base_url.split(",") if u.strip()] or [base_url]
        # The same refusal of a non-http URL as ``rc``.
        self._ends = [transport._parse_base(url).end for url in urls]
        self._urls = urls
        self._current = 0
        self._origin = origin
        # Asked only when an empty token is refused: where one was looked for.
        self._missing_token = missing_token if not token else None
        # Both headers always, even with an empty token, so that the controller
        # answers unauthorized.
        headers = {"Authorization": core.bearer(token), "Content-Type": "application/json"}
        self._http = aio.Client(headers, connect=connect)

    async def aclose(self) -> None:
        await self._http.aclose()

    def _refusal(self, head: core.Head, body: bytes) -> errors.ApiError:
        """The error for a non-2xx answer, as ``transport.Transport._refusal`` makes it."""
        hint = ""
        if self._missing_token is not None and head.status == 401:
            hint = self._missing_token()
        return transport.api_error(head.status, head.reason, body, hint)

    def _unreachable(self, request: str, exc: errors.ConnectFailed) -> errors.ConnectFailed:
        message = f"{request}: {exc}"
        if self._origin:
            plural = "s" if len(self._urls) > 1 else ""
            message += f" (controller{plural} {', '.join(self._urls)} {self._origin})"
        return errors.ConnectFailed(message)

    async def _send(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None,
        body: Any,
        timeout: float | None,
    ) -> tuple[aio.Exchange, str]:
        """Send, failing over to the next base URL when connecting fails, and after a 5xx
        (a read is sent again there; any other request answers the 5xx)."""
        content = None if body is None else json.dumps(body).encode()
        suffix = "?" + urllib.parse.urlencode(sorted(query.items())) if query else ""
        connect = CONNECT_TIMEOUT if timeout is None else timeout
        last: errors.ConnectFailed | None = None
        for step in range(len(self._urls)):
            index = (self._current + step) % len(self._urls)
            request = f"{method} {self._urls[index]}{path}{suffix}"
            try:
                exchange = await self._http.open(
                    method,
                    self._ends[index],
                    path + suffix,
                    content,
                    timeout=timeout,
                    connect_timeout=connect,
                )
            except errors.ConnectFailed as e:
                last = e
                continue
            except errors.TransportError as e:
                raise type(e)(f"{request}: {e}") from e
            self._current = index
            if exchange.status >= 500 and len(self._urls) > 1:
                self._current = (index + 1) % len(self._urls)
                if method == "GET" and step < len(self._urls) - 1:
                    exchange.close()
                    continue
            return exchange, request
        assert last is not None
        raise self._unreachable(f"{method} {self._urls[self._current]}{path}", last) from last

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        timeout: float | None = None,
    ) -> Any:
        """One request, the whole answer read; the JSON body (``None`` when empty).

        ``timeout`` bounds connecting and each wait for the answer; ``None``, as long as
        it takes (connecting, at most ``CONNECT_TIMEOUT``)."""
        exchange, request = await self._send(method, path, query, body, timeout)
        try:
            content = await exchange.read_all(timeout)
        except errors.TransportError as e:
            raise type(e)(f"{request}: {e}") from e
        if not 200 <= exchange.status < 300:
            raise self._refusal(exchange.head, content)
        if not content:
            return None
        try:
            return json.loads(content)
        except ValueError as e:
            raise errors.TransportError(
                f"{request}: controller sent a malformed JSON body ({e})"
            ) from e

    async def stream(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        idle: float | None = None,
    ) -> AsyncIterator[bytes]:
        """A long-lived answer chunk by chunk, each waited for at most ``idle`` seconds
        (``None``: a follow lasts as long as the job); a refusal raises before the first."""
        exchange, request = await self._send(method, path, query, None, None)
        try:
            if not 200 <= exchange.status < 300:
                raise self._refusal(exchange.head, await exchange.read_all(CONNECT_TIMEOUT))
            try:
                while chunk := await exchange.read(idle):
                    yield chunk
            except errors.TransportError as e:
                raise type(e)(f"{request}: {e}") from e
        finally:
            exchange.close()
