"""The worker's requests through httpx, for what only httpx does: imported on first use.

``https://`` controllers (httpx's certificate handling and its environment), a proxy
configured in the environment, and a transport the caller injects. Answers and
failures come out as ``transport``'s, so the rest of the worker never sees httpx.
"""

from __future__ import annotations

from collections.abc import Mapping

from resource_controller.httpxlite import httpx
from resource_controller.worker.transport import Answer, ConnectFailed, TransportError

#: Overall bound on one request when the caller set none (the caller's bound wins).
TIMEOUT = 120.0


class ViaHttpx:
    """One ``httpx.AsyncClient`` with the worker's headers; ``transport`` as httpx takes it."""

    def __init__(
        self, headers: Mapping[str, str], transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self._client = httpx.AsyncClient(
            headers=dict(headers), timeout=TIMEOUT, transport=transport
        )

    async def request(self, method: str, base: str, target: str, body: bytes | None) -> Answer:
        try:
            resp = await self._client.request(method, base + target, content=body)
        except httpx.ConnectError as exc:
            raise ConnectFailed(str(exc) or type(exc).__name__) from exc
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise TransportError(str(exc) or type(exc).__name__) from exc
        headers = {k.lower(): v for k, v in resp.headers.items()}
        return Answer(resp.status_code, resp.reason_phrase, headers, resp.content)

    async def aclose(self) -> None:
        await self._client.aclose()
