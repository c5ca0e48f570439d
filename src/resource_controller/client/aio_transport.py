"""The asyncio client's HTTP: httpx over ``asynchttp`` as the worker's, the same routes, errors and fail-over as ``transport``.

Kept apart from ``aio`` so that the async client's methods and its connection handling
each fit one reading; the sync ``transport`` is the model for both behaviours.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from resource_controller import asynchttp, errors
from resource_controller.client import transport
from resource_controller.httpxlite import httpx


def _cause(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    inner = exc.__cause__ or exc.__context__
    if isinstance(inner, OSError):
        return transport.describe_cause(inner)
    return str(exc) or type(exc).__name__


class AsyncTransport:
    """Requests to one controller (or a fail-over list) with a bearer token."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        origin: str = "",
        missing_token: Callable[[], str] | None = None,
    ) -> None:
        urls = [u.strip().rstrip("/") for u in base_url.split(",") if u.strip()] or [base_url]
        for url in urls:
            transport._parse_base(url)  # the same refusal of a non-http URL as ``rc``
        self._urls = urls
        self._current = 0
        self._origin = origin
        # Asked only when an empty token is refused: where one was looked for.
        self._missing_token = missing_token if not token else None
        # Both headers always, even with an empty token, so that the controller
        # answers unauthorized. httpx refuses a value ending in a space (``Bearer ``), so an
        # empty token goes as the bare scheme, which the controller refuses the same way.
        bearer = f"Bearer {token}" if token else "Bearer"
        headers = {"Authorization": bearer, "Content-Type": "application/json"}
        self._http = httpx.AsyncClient(
            headers=headers, timeout=None, trust_env=False, transport=asynchttp.Transport()
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    def _refusal(self, resp: httpx.Response) -> errors.ApiError:
        """The error for a non-2xx answer, as ``transport.Transport._refusal`` makes it."""
        hint = ""
        if self._missing_token is not None and resp.status_code == 401:
            hint = self._missing_token()
        return transport.api_error(resp.status_code, resp.reason_phrase, resp.content, hint)

    def _unreachable(self, request: str, exc: httpx.HTTPError) -> errors.TransportError:
        message = f"{request}: {_cause(exc)}"
        if self._origin:
            plural = "s" if len(self._urls) > 1 else ""
            message += f" (controller{plural} {', '.join(self._urls)} {self._origin})"
        return errors.TransportError(message)

    async def _send(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None,
        body: Any,
        timeout: float | None,
        stream: bool,
    ) -> tuple[httpx.Response, str]:
        """Send, failing over to the next base URL when connecting fails, and after a 5xx
        (a read is sent again there; any other request answers the 5xx)."""
        content = None if body is None else json.dumps(body).encode()
        suffix = "?" + urllib.parse.urlencode(sorted(query.items())) if query else ""
        last: httpx.HTTPError | None = None
        for step in range(len(self._urls)):
            index = (self._current + step) % len(self._urls)
            url = self._urls[index] + path + suffix
            request = f"{method} {url}"
            req = self._http.build_request(
                method, url, content=content, timeout=httpx.Timeout(timeout)
            )
            try:
                resp = await self._http.send(req, stream=stream)
            except httpx.ConnectError as e:
                last = e
                continue
            except httpx.HTTPError as e:
                raise errors.TransportError(f"{request}: {_cause(e)}") from e
            self._current = index
            if resp.status_code >= 500 and len(self._urls) > 1:
                self._current = (index + 1) % len(self._urls)
                if method == "GET" and step < len(self._urls) - 1:
                    await resp.aclose()
                    continue
            return resp, request
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
        """One request, the whole answer read; the JSON body (``None`` when empty)."""
        resp, request = await self._send(method, path, query, body, timeout, stream=False)
        if not 200 <= resp.status_code < 300:
            raise self._refusal(resp)
        if not resp.content:
            return None
        try:
            return json.loads(resp.content)
        except ValueError as e:
            raise errors.TransportError(
                f"{request}: controller sent a malformed JSON body ({e})"
            ) from e

    async def stream(
        self, method: str, path: str, *, query: Mapping[str, str] | None = None
    ) -> AsyncIterator[bytes]:
        """A long-lived answer chunk by chunk; a refusal raises before the first chunk."""
        resp, request = await self._send(method, path, query, None, None, stream=True)
        try:
            if not 200 <= resp.status_code < 300:
                await resp.aread()
                raise self._refusal(resp)
            try:
                async for chunk in resp.aiter_raw():
                    if chunk:
                        yield chunk
            except httpx.HTTPError as e:
                raise errors.TransportError(f"{request}: {_cause(e)}") from e
        finally:
            await resp.aclose()
