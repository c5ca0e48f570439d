"""``GET /v1/events``: server-sent events, each written within ``WRITE_DEADLINE`` or the reader is
cut; its token may come as ``?token=`` (AUTH-004)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from resource_controller.controller import events
from resource_controller.controller.deps import RouteCall, Services, disconnected

log = logging.getLogger(__name__)

HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
}


class EventStream(Response):
    """Headers at once, then frames and keepalives until the reader leaves or is cut."""

    media_type = "text/event-stream"

    def __init__(self, svc: Services) -> None:
        # No Content-Length: the body is open-ended (Response would declare 0).
        self.status_code = 200
        self.background = None
        self.body = b""
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            *((k.lower().encode(), v.encode()) for k, v in HEADERS.items()),
        ]
        self.svc = svc

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hub = self.svc.hub
        sub = hub.events.subscribe()
        try:
            await self._send(
                send,
                {"type": "http.response.start", "status": 200, "headers": self.raw_headers},
            )
            await self._send(send, {"type": "http.response.body", "body": b"", "more_body": True})
            await self._pump(sub, receive, send)
        except TimeoutError:
            log.info(
                "event stream reader cut: a frame was not accepted within %g s",
                events.WRITE_DEADLINE,
            )
        except OSError:
            pass
        finally:
            hub.events.unsubscribe(sub)

    @staticmethod
    async def _send(send: Send, message: Message) -> None:
        async with asyncio.timeout(events.WRITE_DEADLINE):
            await send(message)

    async def _pump(self, sub: events.Subscription, receive: Receive, send: Send) -> None:
        hub = self.svc.hub
        loop = asyncio.get_running_loop()
        gone = loop.create_task(disconnected(receive))
        stop = loop.create_task(hub.shutting_down.wait())
        try:
            while not gone.done() and not stop.done():
                nxt = loop.create_task(sub.queue.get())
                done, _ = await asyncio.wait(
                    {nxt, gone, stop}, timeout=events.KEEPALIVE, return_when=asyncio.FIRST_COMPLETED
                )
                if nxt in done:
                    body = nxt.result()
                else:
                    nxt.cancel()
                    if gone in done or stop in done:
                        break
                    body = events.KEEPALIVE_FRAME
                await self._send(
                    send, {"type": "http.response.body", "body": body, "more_body": True}
                )
            if not gone.done():
                with contextlib.suppress(Exception):
                    await self._send(send, {"type": "http.response.body", "body": b""})
        finally:
            gone.cancel()
            stop.cancel()


async def stream(call: RouteCall) -> Response:
    return EventStream(call.svc)
