"""The asyncio client's HTTP, and its driver: ``h1.aio`` with ``transport``'s bounds,
fail-over, errors and controller list (``transport.Bases``), carrying out the same
operations as ``api.JsonClient`` (``calls``), awaited.

After an interrupt (a cancelled task) has been thrown into an operation, the steps it
takes to handle it (a cancel, a release) run shielded, and so does a submit: a task
cancelled while a submit's answer is on its way waits for it, and the cancellation then
lands on the next step, so the job it created is known and cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from resource_controller import errors
from resource_controller.client import calls
from resource_controller.client.calls import Call
from resource_controller.client.transport import Bases, decode
from resource_controller.h1 import aio

if TYPE_CHECKING:
    from resource_controller.client.calls import Op


class AsyncStream:
    """An open answer; ``read(idle)`` gives ``None`` after ``idle`` seconds of silence and
    keeps the read it was waiting on for the next call, so the stream stays open."""

    def __init__(self, exchange: aio.Exchange, request: str, base: str) -> None:
        self._exchange = exchange
        self._reading: asyncio.Future[bytes] | None = None
        self.request = request
        self.base = base

    async def read(self, idle: float | None = None) -> bytes | None:
        if self._reading is None:
            self._reading = asyncio.ensure_future(self._exchange.read(None))
        done, _ = await asyncio.wait({self._reading}, timeout=idle)
        if not done:
            return None
        reading, self._reading = self._reading, None
        try:
            return reading.result()
        except errors.TransportError as e:
            raise type(e)(f"{self.request}: {e}") from e

    def close(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
        self._exchange.close()


class AsyncTransport:
    """Requests to one controller (or a fail-over list) with a bearer token, and the
    driver of the client's operations over them."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        origin: str = "",
        missing_token: Callable[[], str] | None = None,
        connect: aio.Connect = aio.open_tcp,
    ) -> None:
        self.bases = Bases(base_url, origin, missing_token, token)
        self._http = aio.HttpClient(self.bases.headers, connect=connect)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: Call, *, whole: bool) -> tuple[aio.Exchange, bytes, str]:
        """As ``transport.Transport._send``: each controller in turn within the bound."""
        tries = self.bases.tries(call)
        for index in tries:
            target, request = self.bases.target(index, call.path, call.query)
            request = f"{call.method} {request}"
            end = self.bases.bases[index].end
            try:
                exchange = await self._http.open(
                    call.method,
                    end,
                    target.removeprefix(end.prefix),
                    tries.payload,
                    timeout=tries.bound,
                )
                data = b""
                if whole or not 200 <= exchange.status < 300:
                    data = await exchange.read_all(tries.bound)
            except errors.ConnectFailed as e:
                tries.failed(e)
                continue
            except errors.TransportError as e:
                named = type(e)(f"{request}: {e}")
                named.__cause__ = e
                tries.failed(named)
                continue
            if tries.answered(index, exchange.status, exchange.head.reason, data):
                return exchange, data, request
        raise AssertionError("unreachable")  # pragma: no cover

    async def request(self, call: Call) -> Any:
        """One request, its whole answer read: its JSON, read as ``call`` says."""
        try:
            _, data, request = await self._send(call, whole=True)
        except errors.ApiError as e:
            raise e if call.refuse is None else call.refuse(e) from e
        return call.answer(decode(data, request), request)

    async def stream(self, call: Call) -> AsyncStream:
        exchange, _, request = await self._send(call, whole=False)
        return AsyncStream(exchange, request, self.bases.url)

    # ---- the driver ------------------------------------------------------------------

    async def drive(self, op: Op[Any] | Call) -> Any:
        """Carry ``op`` out and return what it returns (its lines are dropped)."""
        result: list[Any] = []
        async for _ in self._steps(op, result):
            raise errors.ClientError("this operation's output has nowhere to go")
        return result[0]

    async def iterate(self, op: Op[Any]) -> AsyncIterator[Any]:
        """``op``'s output as it comes; closing the iterator drops its stream."""
        async for chunk in self._steps(op, []):
            yield chunk

    async def _steps(self, op: Op[Any] | Call, result: list[Any]) -> AsyncIterator[Any]:
        if isinstance(op, Call):
            result.append(await self.request(op))
            return
        streams: list[AsyncStream] = []
        value: Any = None
        thrown: BaseException | None = None
        pending: BaseException | None = None
        interrupted = False
        try:
            while True:
                try:
                    step = op.send(value) if thrown is None else op.throw(thrown)
                except StopIteration as done:
                    result.append(done.value)
                    return
                value = thrown = None
                if pending is not None:  # a cancellation held back: it lands here
                    thrown, pending = pending, None
                    continue
                if isinstance(step, calls.Out):
                    yield step.chunk
                    continue
                try:
                    if interrupted or getattr(step, "shield", False):
                        job = asyncio.ensure_future(self._do(step, streams))
                        try:
                            value = await asyncio.shield(job)
                        except asyncio.CancelledError as e:
                            value, pending = await asyncio.shield(job), e
                    else:
                        value = await self._do(step, streams)
                except BaseException as e:  # errors and interrupts: the operation decides
                    thrown = e
                    interrupted = interrupted or not isinstance(e, Exception)
        finally:
            for stream in streams:
                stream.close()

    async def _do(self, step: Any, streams: list[AsyncStream]) -> Any:
        if isinstance(step, Call):
            return await self.request(step)
        if isinstance(step, calls.Sleep):
            await asyncio.sleep(step.seconds)
        elif isinstance(step, calls.Read):
            return await step.stream.read(step.idle)
        elif isinstance(step, calls.Open):
            streams.append(await self.stream(step.call))
            return streams[-1]
        elif isinstance(step, calls.Close):
            step.stream.close()
        elif isinstance(step, calls.Where):
            return self.bases.url
        elif isinstance(step, calls.JoinRelay):
            raise errors.ClientError(f"job {step.job_id}: stdio {step.stdio!r} needs rc")
        return None  # a Note: the API says nothing
