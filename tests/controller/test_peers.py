"""Wake-ups between controllers (EXT-PG-3): what goes on the wire, and what does not."""

from __future__ import annotations

import asyncio
import json

from resource_controller.controller import peers
from resource_controller.controller.hub import Hub
from resource_controller.controller.wake import SCHEDULE, Wake, apply


def test_a_wake_crosses_as_json_and_comes_back_equal() -> None:
    wake = Wake(
        workers=frozenset({"w1", "w2"}),
        ended=frozenset({"j1"}),
        output=frozenset({"j2"}),
        devices=True,
        jobs=(("j1", "succeeded"), ("j3", "assigned")),
        assigned=True,
        swept=True,
    )
    sender, back = peers.decode(peers.encode("me", wake))
    assert (sender, back) == ("me", wake)


def test_a_kick_alone_does_not_cross() -> None:
    # The controller where the change landed runs its pass itself.
    assert not peers.crosses(SCHEDULE)
    assert peers.crosses(Wake(workers=frozenset({"w"})))


def test_a_wake_too_large_for_one_notification_wakes_everyone() -> None:
    wake = Wake(workers=frozenset(f"worker-{n:05d}" for n in range(2000)))
    payload = peers.encode("me", wake)
    assert len(payload.encode()) < 8000
    assert peers.decode(payload) == ("me", Wake(everyone=True))


def test_a_malformed_payload_is_ignored_and_ones_own_too() -> None:
    async def go() -> None:
        hub = Hub()
        link = peers.Peers("postgresql://unused", "me", lambda: 0.0)
        waiter = hub.workers.waiter("w1")
        link._receive(hub, "not json")
        link._receive(hub, json.dumps({"from": "me", "everyone": True}))
        assert not waiter.is_set()
        link._receive(hub, peers.encode("other", Wake(workers=frozenset({"w1"}))))
        assert waiter.is_set()

    asyncio.run(go())


def test_only_local_changes_are_forwarded() -> None:
    async def go() -> None:
        hub = Hub()
        sent: list[Wake] = []
        hub.forward = sent.append
        wake = Wake(workers=frozenset({"w"}))
        apply(hub, wake)
        apply(hub, wake, forward=False)  # another controller's: never sent back
        assert sent == [wake]

    asyncio.run(go())


def test_alone_it_leads_from_the_start_and_sends_nothing() -> None:
    alone = peers.Peers(None, "me", lambda: 42.0)
    assert alone.alone and alone.leading and alone.since == 42.0
    alone.forward(Wake(workers=frozenset({"w"})))  # no outbox: dropped, no error
