"""Batching a job's output into log appends (WRK-083, WRK-086, EXT-OUTBOX-1).

One queue drained by one task keeps batches in order; a size flush waits for its send
(back-pressure). A chunk not taken goes to ``keep`` (the outbox), and every later one
until those are delivered; a retry may store a chunk twice rather than drop output.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from resource_controller.h1.aio import Answer
from resource_controller.worker import delivery, outbox

log = logging.getLogger(__name__)

#: A batch is sent a second after its first byte, or at once at this size.
FLUSH_AFTER = 1.0
FLUSH_BYTES = 65_536

Sender = Callable[[bytes], Awaitable[Answer]]
#: Keeps a chunk for later delivery; the event is set once it is answered for good.
Keeper = Callable[[bytes], Awaitable[asyncio.Event]]

_Item = tuple[bytes, asyncio.Future[None] | None]


class LogShipper:
    """Collects one job's output and ships it in ordered batches through ``send``."""

    def __init__(
        self,
        send: Sender,
        keep: Keeper,
        *,
        label: str = "",
        flush_after: float = FLUSH_AFTER,
        flush_bytes: int = FLUSH_BYTES,
    ) -> None:
        self._send = send
        self._keep = keep
        #: The latest kept chunk's answer, which later chunks queue behind.
        self._behind: asyncio.Event | None = None
        self._label = label
        self._flush_after = flush_after
        self._flush_bytes = flush_bytes
        self._batch = bytearray()
        self._timer: asyncio.Task[None] | None = None
        self._queue: asyncio.Queue[_Item | None] = asyncio.Queue()
        self._drainer: asyncio.Task[None] | None = None
        self._closed = False
        self.sent_bytes = 0
        self.kept_bytes = 0
        self.lost_bytes = 0

    async def write(self, data: bytes) -> None:
        """Add output; returns once any size-triggered send of it has completed."""
        if not data:
            return
        if self._closed:
            raise RuntimeError("write after close")
        was_empty = not self._batch
        self._batch += data
        if len(self._batch) >= self._flush_bytes:
            done = self._cut(wait=True)
            if done is not None:
                await asyncio.shield(done)
        elif was_empty:
            self._timer = asyncio.create_task(self._flush_later(), name=f"logflush-{self._label}")

    async def close(self) -> None:
        """Final flush: send what remains and wait until every send is done."""
        if self._closed:
            return
        self._closed = True
        self._cut(wait=False)
        self._queue.put_nowait(None)
        if self._drainer is not None:
            await asyncio.shield(self._drainer)

    async def abandon(self) -> None:
        """Stop without delivering (task cancellation): drop the batch and the queue."""
        self._closed = True
        for task in (self._timer, self._drainer):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def _cut(self, *, wait: bool) -> asyncio.Future[None] | None:
        """Queue the current batch; with ``wait``, a future for its send."""
        if self._timer is not None:
            if self._timer is not asyncio.current_task():
                self._timer.cancel()
            self._timer = None
        if not self._batch:
            return None
        chunk = bytes(self._batch)
        self._batch.clear()
        done: asyncio.Future[None] | None = None
        if wait:
            done = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((chunk, done))
        if self._drainer is None:
            self._drainer = asyncio.create_task(self._drain(), name=f"logship-{self._label}")
        return done

    async def _flush_later(self) -> None:
        await asyncio.sleep(self._flush_after)
        self._cut(wait=False)

    async def _drain(self) -> None:
        while True:
            item = await self._queue.get()
            if item is None:
                return
            chunk, done = item
            try:
                await self._ship(chunk)
            finally:
                if done is not None and not done.done():
                    done.set_result(None)

    async def _ship(self, chunk: bytes) -> None:
        """Send one chunk straight, or keep it: behind kept ones, or when not taken."""
        if self._behind is None or self._behind.is_set():
            verdict, problem = await delivery.attempt(self._send(chunk), outbox.LOG)
            if verdict is delivery.Verdict.DELIVERED:
                self.sent_bytes += len(chunk)
                return
            if verdict is delivery.Verdict.REFUSED:
                self.lost_bytes += len(chunk)
                log.warning(
                    "job %s: %d bytes of output refused for good (%s); dropped",
                    self._label,
                    len(chunk),
                    problem,
                    extra={"action": "log_chunk_lost", "job_id": self._label},
                )
                return
            log.warning(
                "job %s: %d bytes of output not taken (%s); kept in the outbox, and the "
                "output after them too, until they are delivered",
                self._label,
                len(chunk),
                problem,
                extra={"action": "log_chunk_kept", "job_id": self._label},
            )
        self._behind = await self._keep(chunk)
        self.kept_bytes += len(chunk)
