"""The four relay routes (controller-api.md §11), streaming on the raw ASGI channels."""

from __future__ import annotations

import asyncio
import contextlib
import functools

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from resource_controller import errors
from resource_controller.controller.deps import RouteCall, Services, disconnected
from resource_controller.controller.relay import Half, Relay, Session

#: Response content types per half.
OCTETS = "application/octet-stream"
NDJSON = "application/x-ndjson"
TEXT = "text/plain; charset=utf-8"
_NOSNIFF = (b"x-content-type-options", b"nosniff")


#: The halves whose payload is their request body (the POST halves).
_SENDERS = frozenset({Half.WORKER_OUT, Half.CLIENT_IN})


async def _join(svc: Services, job_id: str, half: Half, http_version: str) -> Session:
    """The one store read, then the session slot."""
    await svc.db(svc.store.views.job, job_id)  # unknown: 404 not_found; failure: 500
    if half in _SENDERS and http_version != "1.1":
        # A POST half streams its body after the 200, which this server does on HTTP/1.1 only.
        raise errors.Unsupported(
            f"the {half.value} half needs a full-duplex HTTP/1.1 stream, not HTTP/{http_version}"
        )
    return svc.hub.relay.attach(job_id, half)


class _Relayed(Response):
    """A response that runs one half of a session with the raw ASGI channels."""

    def __init__(self, relay: Relay, session: Session, half: Half, media_type: str) -> None:
        super().__init__(status_code=200, media_type=media_type)
        self.relay = relay
        self.session = session
        self.half = half
        #: This half's direction, fixed at connect (a later input direction is not ours).
        self.pipe = session.pipe_of(half)
        # A stream has no length: without one the server sends it chunked.
        self.raw_headers = [h for h in self.raw_headers if h[0] != b"content-length"]
        self.raw_headers.append(_NOSNIFF)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            if self.half in _SENDERS:
                await self._pump_body(receive)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            elif await self._feed_socket(receive, send):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self.relay.half_ended(self.session, self.half, self.pipe)

    async def _pump_body(self, receive: Receive) -> None:
        """A POST half: hand each piece of the request body to the peer, until the body
        ends, the session is over or the controller stops."""
        pumping = asyncio.create_task(self._pump(receive))
        over = asyncio.create_task(self.session.over.wait())
        stopping = asyncio.create_task(self.relay.stopping.wait())
        try:
            await asyncio.wait({pumping, over, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pumping, over, stopping):
                task.cancel()
            for task in (pumping, over, stopping):
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _pump(self, receive: Receive) -> None:
        while True:
            got = await receive()
            if got["type"] != "http.request":
                return  # the sender went away
            data: bytes = got.get("body", b"")
            alone = functools.partial(self.session.alone, self.half)
            if data and not await self.pipe.send(data, self.relay.handoff_guard, alone):
                return  # the direction closed: refuse what follows
            if not got.get("more_body", False):
                return  # end of stream: the process exited, or stdin EOF

    async def _feed_socket(self, receive: Receive, send: Send) -> bool:
        """A GET half: copy the peer's bytes to the socket; ``True`` on a clean end."""
        pipe = self.pipe
        gone = asyncio.create_task(disconnected(receive), name=f"relay-{self.half.value}-gone")
        try:
            while True:
                chunk = asyncio.create_task(pipe.recv())
                await asyncio.wait({chunk, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not chunk.done():
                    chunk.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await chunk
                    return False  # Noticed even while idle
                data = chunk.result()
                if data is None:
                    return True
                try:
                    async with asyncio.timeout(self.relay.write_deadline):
                        await send({"type": "http.response.body", "body": data, "more_body": True})
                except TimeoutError:
                    return False  # A peer that accepts nothing is dropped
        finally:
            gone.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await gone


async def _open(call: RouteCall, half: Half, media: str) -> Response:
    session = await _join(call.svc, call.param, half, call.request.scope["http_version"])
    return _Relayed(call.svc.hub.relay, session, half, media)


async def client_out(call: RouteCall) -> Response:
    """The job's output, to the operator (TTY-001 client-out)."""
    return await _open(call, Half.CLIENT_OUT, OCTETS)


async def client_in(call: RouteCall) -> Response:
    """Operator input, from the request body (TTY-001 client-in)."""
    return await _open(call, Half.CLIENT_IN, TEXT)


async def worker_out(call: RouteCall) -> Response:
    """The job's output, from the box (TTY-001 worker-out)."""
    return await _open(call, Half.WORKER_OUT, TEXT)


async def worker_in(call: RouteCall) -> Response:
    """Operator input, to the box (TTY-001 worker-in)."""
    return await _open(call, Half.WORKER_IN, NDJSON)
