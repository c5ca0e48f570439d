"""Batching a job's output into log appends.

Output is gathered into a batch and handed to a sender: one second after the first
byte of a batch, or at once when the batch reaches 64 KiB. All sends go through one
queue drained by one task, so they are strictly serialised and leave in the order their
batches were cut: a timer flush can never overtake a size flush. A size flush waits for
its own send (back-pressure on the reader is acceptable); a timer flush does not, so
new output keeps flowing into a fresh batch while a send is in flight.

A failed send loses that chunk, with a warning: logs are never retried, and nothing
here caps a job's total output.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

#: A batch is sent this long after its first byte (``Timings.log_flush_after``).
FLUSH_AFTER = 1.0
#: A batch this large is sent at once; far below the 1 MiB chunk limit.
FLUSH_BYTES = 65_536

#: Delivers one chunk; raising means the chunk was lost.
Sender = Callable[[bytes], Awaitable[None]]

_Item = tuple[bytes, asyncio.Future[None] | None]


class LogShipper:
    """Collects one job's output and ships it in ordered batches through ``send``."""

    def __init__(
        self,
        send: Sender,
        *,
        label: str = "",
        flush_after: float = FLUSH_AFTER,
        flush_bytes: int = FLUSH_BYTES,
    ) -> None:
        self._send = send
        self._label = label
        self._flush_after = flush_after
        self._flush_bytes = flush_bytes
        self._batch = bytearray()
        self._timer: asyncio.Task[None] | None = None
        self._queue: asyncio.Queue[_Item | None] = asyncio.Queue()
        self._drainer: asyncio.Task[None] | None = None
        self._closed = False
        #: Bytes handed to the sender successfully, and bytes lost to failed sends.
        self.sent_bytes = 0
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
        """Take the current batch and queue it; optionally return a future for its send."""
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
                await self._send(chunk)
            except Exception as exc:  # a lost chunk is a warning, never a failed job
                self.lost_bytes += len(chunk)
                log.warning(
                    "job %s: %d bytes of output lost: %s",
                    self._label,
                    len(chunk),
                    str(exc) or type(exc).__name__,
                    extra={"action": "log_chunk_lost", "job_id": self._label},
                )
            else:
                self.sent_bytes += len(chunk)
            finally:
                if done is not None and not done.done():
                    done.set_result(None)
