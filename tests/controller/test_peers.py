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
        preempted=(("j4", "j5"),),
    )
    sender, back = peers.decode(peers.encode("me", wake))
    assert (sender, back) == ("me", wake)


def test_another_controllers_preemption_is_an_event_here_but_never_a_second_webhook() -> None:
    # EXT-PREEMPT-3: every controller's /v1/events says job.preempted; the deciding one's
    # webhooks alone post it.
    async def go() -> None:
        hub = Hub()
        posted: list[object] = []
        hub.notifier = type("Notifier", (), {"emit": lambda self, n: posted.append(n)})()
        events = hub.events.subscribe()
        wake = Wake(preempted=(("victim", "waiting"),))
        apply(hub, wake, forward=False)
        assert posted == []
        message = events.queue.get_nowait().decode()
        assert "job.preempted" in str(message) and "victim" in str(message)
        apply(hub, wake)
        assert len(posted) == 1

    asyncio.run(go())


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


def test_a_wake_for_everyone_crosses_as_such() -> None:
    assert peers.decode(peers.encode("me", Wake(everyone=True))) == ("me", Wake(everyone=True))


def test_a_lone_controller_sends_nothing_until_another_arrives_then_wakes_everyone() -> None:
    async def go() -> None:
        link = peers.Peers("postgresql://unused", "me", lambda: 0.0)
        link._outbox = asyncio.Queue()
        wake = Wake(workers=frozenset({"w"}))
        link.forward(wake)  # who else listens is not known yet: sent
        link._count(1)  # alone
        link.forward(wake)
        assert link._outbox.qsize() == 1 and link.others == 0
        link._outbox.get_nowait()
        link._count(2)  # another arrived: what was not sent is made up for
        assert link._outbox.get_nowait() == Wake(everyone=True)
        link.forward(wake)
        assert link._outbox.get_nowait() == wake
        link._count(2)  # no newcomer: nothing more
        assert link._outbox.empty()

    asyncio.run(go())


def test_a_hello_from_another_ends_being_alone_at_once() -> None:
    async def go() -> None:
        hub = Hub()
        link = peers.Peers("postgresql://unused", "me", lambda: 0.0)
        link._outbox = asyncio.Queue()
        link._count(1)
        link._receive(hub, peers.hello("me"))  # one's own: nothing
        assert link.others == 0 and link._outbox.empty()
        link._receive(hub, peers.hello("other"))
        assert link.others == 1
        assert link._outbox.get_nowait() == Wake(everyone=True)
        link.forward(Wake(workers=frozenset({"w"})))
        assert not link._outbox.empty()

    asyncio.run(go())
