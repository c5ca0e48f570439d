"""Several controllers on one PostgreSQL database (ARCHITECTURE.md): the leadership lease and
wake-ups over LISTEN/NOTIFY (hints only); exclusivity never rests on leadership."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from resource_controller.controller.hub import Hub
from resource_controller.controller.wake import SCHEDULE, Wake, apply
from resource_controller.store.leadership import Fence
from resource_controller.store.peering import PeerLink

log = logging.getLogger(__name__)

#: Seconds between a follower's tries of the lease, and between a leader's renewals.
TICK = 0.5
#: Seconds a renewal holds the lease; another takes over within a ``TICK`` more (EXT-PG-8).
LEASE = 3.0
#: A renewal or a try that takes longer than this counts as a lost connection.
CHECK_BOUND = 2.0
#: The server ends a tick link idle this long: its controller is frozen.
LINK_IDLE = 5.0
#: PostgreSQL refuses payloads of 8000 bytes or more: those go as "wake everyone".
PAYLOAD_MAX = 7900


class Peers:
    """This controller's standing among the others, and its wake-up channel to them."""

    def __init__(
        self,
        url: str | None,
        instance: str,
        clock: Callable[[], float],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``url``: the PostgreSQL database (libpq form) the controllers share; None alone.
        ``clock`` dates ``since``; ``monotonic`` times the lease."""
        self.url = url
        self.instance = instance
        self._clock = clock
        self._monotonic = monotonic
        #: Until when (``monotonic``) the last renewal holds the lease; None: not held.
        self._until: float | None = math.inf if url is None else None
        #: The epoch of the lease this controller holds, or last held.
        self._epoch = 0
        #: When it last began to lead (its clock); the reaper's hold-off counts from here.
        self.since: float | None = clock() if url is None else None
        self._outbox: asyncio.Queue[Wake] | None = None
        #: Other controllers listening, as of the last tick; None before the first.
        self.others: int | None = None

    @property
    def leading(self) -> bool:
        """This controller leads: only then do the periodic pass and the reaper run."""
        return self._until is not None and self._monotonic() < self._until

    @property
    def fence(self) -> Fence | None:
        """What a leader-only write is made under (``store/leadership.hold``): the epoch
        this controller holds or last held; None alone, where it leads without a lease."""
        return None if self.url is None else Fence(self.instance, self._epoch)

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
        if self._until is not None:
            log.warning("this controller stopped leading: %s", why or "shutting down")
        self._until = None
        self.since = None

    async def _session(self, hub: Hub) -> None:
        """One connection's life: LISTEN, then each ``TICK`` renew (or try to take) the
        lease and apply what the others sent. Any failure ends it, and leadership with it."""
        assert self.url is not None
        link = await PeerLink.open(self.url, CHECK_BOUND * 2, idle=LINK_IDLE)
        try:
            await link.listen()
            # Say so at once: a lone controller stops dropping its wake-ups on hearing it.
            await link.notify(hello(self.instance))
            while not hub.shutting_down.is_set():
                await link.within(CHECK_BOUND, self._tick(link, hub))
                async for payload in link.received(TICK):
                    self._receive(hub, payload)
        finally:
            await link.close()

    async def _tick(self, link: PeerLink, hub: Hub) -> None:
        asked = self._monotonic()  # the lease runs from before the database saw the ask
        if self._until is not None and not self.leading:
            self._step_down(f"its lease lapsed (not renewed for {LEASE:g} s)")
        if self.leading:
            kept, present = await link.renew(Fence(self.instance, self._epoch), LEASE)
            self._count(present)
            if kept:
                self._until = asked + LEASE
            else:
                self._step_down("its lease was lost (lapsed, or another controller took it)")
            return
        epoch, present = await link.take(self.instance, LEASE)
        self._count(present)
        if epoch is not None:
            self._epoch, self._until, self.since = epoch, asked + LEASE, self._clock()
            log.info(
                "this controller leads, epoch %d (scheduler, reaper and retention run here)",
                epoch,
            )
            apply(hub, SCHEDULE, forward=False)

    def _count(self, present: int) -> None:
        """Note how many controllers are present; a newcomer missed wake-ups, so wake everyone."""
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


#: The wake-ups another controller acts on: never a kick or a webhook notice.
CROSSING = ("workers", "ended", "output", "devices", "jobs", "assigned", "swept", "preempted")


def crosses(wake: Wake) -> bool:
    return any(getattr(wake, name) for name in CROSSING)


def encode(instance: str, wake: Wake) -> str:
    """The notification payload of ``wake``; "wake everyone" when it would not fit."""
    everyone = json.dumps({"from": instance, "everyone": True})
    if wake.everyone:
        return everyone
    body: dict[str, Any] = {"from": instance}
    for name in CROSSING:
        value = getattr(wake, name)
        body[name] = sorted(value) if isinstance(value, frozenset) else value
    text = json.dumps(body, separators=(",", ":"))
    return everyone if len(text.encode()) > PAYLOAD_MAX else text


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
        # A controller of the release before sends none.
        preempted=tuple((str(j), str(by)) for j, by in body.get("preempted", ())),
    )
