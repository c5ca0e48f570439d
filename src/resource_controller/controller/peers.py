"""Several controllers on one PostgreSQL database: which one leads, and the wake-ups
that cross from one to the others.

Leadership: the controller holding a session advisory lock, on a connection
of its own, runs the periodic scheduling pass, the reaper and log retention. The others
try the lock every ``TICK``, so one of them leads within a second or two of the
leader's death: PostgreSQL ends a dead client's session and its locks with it. A
leader checks its connection every ``TICK`` as well, and steps down (the flag first,
before anything else) when the check fails or outlasts ``CHECK_BOUND``. Exclusivity
never rests on this lock: it is the allocation transaction's and the live-lease
index's, which every controller's grants go through.

Wake-ups: the wake-ups of each committed change (``wake.Wake``) go out on
one LISTEN/NOTIFY channel, and every other controller applies them to its own hub, so
a worker long-polling B learns at once of an assignment A made, and B's event stream
carries A's changes. A wake-up is a hint (``hub.py``): one lost costs a poll timeout,
never correctness. A scheduling kick is not sent: the controller where a change
lands runs that change's pass itself.

Presence: each controller holds a shared advisory lock while it listens, and counts
the holders at each tick; one that begins to listen says ``hello`` on the channel. A
controller that finds itself alone on the database sends nothing (a notification
nobody hears still costs a round trip a change); when it hears another arrive it sends
one "wake everyone", so that what it did not send meanwhile costs the newcomer's
waiters nothing.

On SQLite there is one controller: it leads from the start and sends nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable

from resource_controller.controller.hub import Hub
from resource_controller.controller.wake import SCHEDULE, Wake, apply
from resource_controller.store.peering import PeerLink

log = logging.getLogger(__name__)

#: Seconds between a follower's tries of the lock, and between a leader's checks.
TICK = 1.0
#: A check or a try that takes longer than this counts as a lost connection.
CHECK_BOUND = 2.0
#: PostgreSQL refuses a notification payload of 8000 bytes or more; a wake-up that
#: would not fit is sent as "wake everyone" instead.
PAYLOAD_MAX = 7900


class Peers:
    """This controller's standing among the others, and its wake-up channel to them."""

    def __init__(self, url: str | None, instance: str, clock: Callable[[], float]) -> None:
        """``url``: the PostgreSQL database (libpq form) the controllers share; None alone."""
        self.url = url
        self.instance = instance
        self._clock = clock
        #: This controller leads: only then do the periodic pass and the reaper run.
        self.leading = url is None
        #: When it last began to lead (its clock); the reaper's hold-off counts from here.
        self.since: float | None = clock() if url is None else None
        self._outbox: asyncio.Queue[Wake] | None = None
        #: How many other controllers listen on the database, as of the last tick;
        #: None until the first (wake-ups are sent while it is not known).
        self.others: int | None = None

    @property
    def alone(self) -> bool:
        return self.url is None

    def forward(self, wake: Wake) -> None:
        """Queue a committed change's wake-ups for the other controllers (``wake.apply``)."""
        if self._outbox is not None and self.others != 0 and crosses(wake):
            self._outbox.put_nowait(wake)

    async def run(self, hub: Hub) -> None:
        """Lead or follow, listen and send, until the controller shuts down."""
        if self.alone:
            return
        self._outbox = asyncio.Queue()
        sender = asyncio.create_task(self._send_loop(), name="peers-send")
        try:
            while not hub.shutting_down.is_set():
                try:
                    await self._session(hub)
                except Exception as exc:
                    self._step_down(f"{type(exc).__name__}: {exc}")
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(hub.shutting_down.wait(), TICK)
        finally:
            self._step_down("")
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender

    def _step_down(self, why: str) -> None:
        if self.leading:
            log.warning("this controller stopped leading: %s", why or "shutting down")
        self.leading = False
        self.since = None

    async def _session(self, hub: Hub) -> None:
        """One connection's life: LISTEN, then each ``TICK`` try (or check) the lock and
        apply what the others sent. Any failure ends it, and leadership with it."""
        assert self.url is not None
        link = await PeerLink.open(self.url, CHECK_BOUND * 2)
        try:
            await link.listen()
            # Say so at once: a lone controller stops dropping its wake-ups on hearing
            # it, not a tick later.
            await link.notify(hello(self.instance))
            while not hub.shutting_down.is_set():
                await link.within(CHECK_BOUND, self._tick(link, hub))
                async for payload in link.received(TICK):
                    self._receive(hub, payload)
        finally:
            await link.close()

    async def _tick(self, link: PeerLink, hub: Hub) -> None:
        if self.leading:
            self._count(await link.check())
            return
        leads, present = await link.try_lead()
        self._count(present)
        if leads:
            self.leading, self.since = True, self._clock()
            log.info("this controller leads (scheduler, reaper and retention run here)")
            apply(hub, SCHEDULE, forward=False)

    def _count(self, present: int) -> None:
        """Note how many controllers are present (this one among them). One that
        arrived since the last tick missed what a lone controller did not send: it is
        told to wake everyone."""
        others = max(0, present - 1)
        if self.others == 0 and others > 0 and self._outbox is not None:
            self._outbox.put_nowait(Wake(everyone=True))
        self.others = others

    def _receive(self, hub: Hub, payload: str) -> None:
        try:
            sender, wake = decode(payload)
        except (ValueError, KeyError, TypeError):
            log.warning("ignored a malformed wake-up from another controller")
            return
        if sender == self.instance:
            return
        if wake is None:  # another controller began to listen
            self._count((self.others or 0) + 2)
            return
        apply(hub, wake, forward=False)

    async def _send_loop(self) -> None:
        """Send queued wake-ups, those queued together as one notification."""
        assert self._outbox is not None and self.url is not None
        link: PeerLink | None = None
        try:
            while True:
                wake = await self._outbox.get()
                while not self._outbox.empty():
                    wake = wake | self._outbox.get_nowait()
                try:
                    if link is None or link.closed:
                        link = await PeerLink.open(self.url, CHECK_BOUND * 2)
                    await link.within(CHECK_BOUND, link.notify(encode(self.instance, wake)))
                except (ConnectionError, TimeoutError) as exc:
                    # A hint lost: the others find out at their next poll.
                    log.warning("could not send a wake-up to the other controllers: %s", exc)
                    if link is not None:
                        await link.close()
                    link = None
        finally:
            if link is not None:
                await link.close()


def crosses(wake: Wake) -> bool:
    """Whether another controller has anything to do with ``wake``."""
    return bool(
        wake.workers
        or wake.ended
        or wake.output
        or wake.devices
        or wake.jobs
        or wake.assigned
        or wake.swept
    )


def encode(instance: str, wake: Wake) -> str:
    """The notification payload of ``wake`` (its webhook notices stay with their origin)."""
    if wake.everyone:
        return json.dumps({"from": instance, "everyone": True})
    text = json.dumps(
        {
            "from": instance,
            "workers": sorted(wake.workers),
            "ended": sorted(wake.ended),
            "output": sorted(wake.output),
            "devices": wake.devices,
            "jobs": [list(j) for j in wake.jobs],
            "assigned": wake.assigned,
            "swept": wake.swept,
        },
        separators=(",", ":"),
    )
    if len(text.encode()) > PAYLOAD_MAX:
        return json.dumps({"from": instance, "everyone": True})
    return text


def hello(instance: str) -> str:
    """The payload a controller sends when it begins to listen."""
    return json.dumps({"from": instance, "hello": True})


def decode(payload: str) -> tuple[str, Wake | None]:
    """(sender, wake-ups); None for a ``hello``."""
    body = json.loads(payload)
    sender = str(body["from"])
    if body.get("hello"):
        return sender, None
    if body.get("everyone"):
        return sender, Wake(everyone=True)
    return sender, Wake(
        workers=frozenset(str(w) for w in body["workers"]),
        ended=frozenset(str(j) for j in body["ended"]),
        output=frozenset(str(j) for j in body["output"]),
        devices=bool(body["devices"]),
        jobs=tuple((str(j), str(s)) for j, s in body["jobs"]),
        assigned=bool(body["assigned"]),
        swept=bool(body["swept"]),
    )
