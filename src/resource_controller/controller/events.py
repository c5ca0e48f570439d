"""The event stream's broadcaster: nudges (refetch ``/v1/state``), never a change log; publishing
never blocks, a full buffer drops the event for that subscriber only."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger(__name__)

BUFFER = 32  #: frames per subscriber
KEEPALIVE = 20.0  #: seconds between ``: keepalive`` comments
WRITE_DEADLINE = 10.0  #: seconds one frame may take to be accepted
KEEPALIVE_FRAME = b": keepalive\n\n"

JOBS = "jobs"
DEVICES = "devices"
PREEMPTED = "job.preempted"  #: EXT-PREEMPT-3


def stamp(at: float) -> str:
    """RFC 3339 UTC with a Z and sub-second digits, trailing zeros trimmed."""
    moment = datetime.fromtimestamp(at, UTC)
    whole = moment.strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f"{moment.microsecond:06d}".rstrip("0")
    return f"{whole}.{fraction}Z" if fraction else f"{whole}Z"


def frame(kind: str, at: float, payload: Any = None, *, with_payload: bool = False) -> bytes:
    """One ``data: <compact JSON>`` line and a blank line."""
    body: dict[str, Any] = {"kind": kind, "at": stamp(at)}
    if with_payload:
        body["payload"] = payload
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


class Subscription:
    """One reader's bounded buffer of frames."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=BUFFER)
        self.dropped = 0


class Broadcaster:
    """Fan-out of frames to every connected reader; publishing never blocks."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._subs: set[Subscription] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        #: Reads the device views as ``GET /v1/devices`` answers them.
        self.devices_source: Callable[[], Awaitable[list[Any]]] | None = None

    @property
    def subscribers(self) -> int:
        return len(self._subs)

    def subscribe(self) -> Subscription:
        sub = Subscription()
        self._subs.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subs.discard(sub)

    def publish(self, kind: str, payload: Any = None, *, with_payload: bool = False) -> None:
        """Queue one frame for every reader; a full buffer loses it for that reader only."""
        if not self._subs:
            return
        data = frame(kind, self.clock(), payload, with_payload=with_payload)
        for sub in list(self._subs):
            try:
                sub.queue.put_nowait(data)
            except asyncio.QueueFull:
                sub.dropped += 1

    def job(self, job_id: str, state: str) -> None:
        """``jobs`` with ``{"job_id", "state"}``."""
        self.publish(JOBS, {"job_id": job_id, "state": state}, with_payload=True)

    def preempted(self, job_id: str, by: str) -> None:
        """``job.preempted`` with ``{"job_id", "by"}``: a pass chose the job as a victim."""
        self.publish(PREEMPTED, {"job_id": job_id, "by": by}, with_payload=True)

    def jobs_nudge(self) -> None:
        """``jobs`` with no payload: a scheduler pass assigned work."""
        self.publish(JOBS)

    def devices_nudge(self) -> None:
        """``devices`` with no payload: a sweep took devices out."""
        self.publish(DEVICES)

    def devices_changed(self) -> None:
        """``devices`` with the device list, read after the commit only when someone listens."""
        source = self.devices_source
        if not self._subs or source is None:
            return

        async def read_and_publish() -> None:
            try:
                views = await source()
            except Exception:
                log.debug("reading the devices for an event failed; event skipped", exc_info=True)
                return
            self.publish(DEVICES, views, with_payload=True)

        try:
            task = asyncio.get_running_loop().create_task(read_and_publish())
        except RuntimeError:  # no loop (a unit test applying a wake by hand)
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
