"""The leadership lease on a real PostgreSQL database (EXT-PG-8, ``store/leadership.py``):
taken once it lapsed or its holder's session ended, never while renewed; a leader-only
write under an epoch that is over writes nothing; a fenced transaction keeps the lease
from being taken until it ends, and the server ends it when its controller froze."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import psycopg
import pytest

from resource_controller import errors
from resource_controller.clock import FakeClock
from resource_controller.core.expiry import SweepRules
from resource_controller.store import engine, leadership, sql
from resource_controller.store.facade import Store
from resource_controller.store.leadership import Fence
from resource_controller.store.peering import PeerLink
from support import pg

LEASE = 600.0  #: long: a lease lapses here only when a test says so


@pytest.fixture
def url(pg_cluster: pg.Cluster) -> str:
    return pg_cluster.fresh_database()


@pytest.fixture
def pg_store(url: str, clock: FakeClock) -> Iterator[Store]:
    store = Store(url, clock)
    try:
        yield store
    finally:
        store.close()


def lapse(url: str) -> None:
    """The lease's end passes, as it does on the database's clock when nobody renews."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE leadership SET expires_at = 0")


def row(url: str) -> tuple[str, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute("SELECT holder, epoch FROM leadership").fetchone()
    assert found is not None
    return str(found[0]), int(found[1])


def test_the_lease_is_taken_once_it_lapsed_or_its_session_ended_never_while_renewed(
    url: str,
) -> None:
    async def go() -> None:
        a, b = await PeerLink.open(url, 5), await PeerLink.open(url, 5)
        try:
            assert (await a.take("a", LEASE))[0] == 1
            for _ in range(3):  # renewed, held: B's tries take nothing
                assert (await a.renew(Fence("a", 1), LEASE))[0]
                assert (await b.take("b", LEASE))[0] is None
            assert row(url) == ("a", 1)
            lapse(url)
            assert (await b.take("b", LEASE))[0] == 2  # stale: B takes it, one epoch on
            assert not (await a.renew(Fence("a", 1), LEASE))[0]  # A's is over
            assert (await a.take("a", LEASE))[0] is None  # B's is current
            await b.close()  # B's session ends: its lease need not be waited out
            async with asyncio.timeout(10):
                while (epoch := (await a.take("a", LEASE))[0]) is None:
                    await asyncio.sleep(0.01)
            assert epoch == 3 and row(url) == ("a", 3)
        finally:
            for link in (a, b):
                await link.close()

    asyncio.run(go())


def test_a_sweep_under_an_epoch_that_is_over_writes_nothing(
    url: str, pg_store: Store, clock: FakeClock
) -> None:
    pg_store.devices.register("box", "boot-1", [("gpu0", 0)])
    device = "box:gpu0"
    clock.advance(31)  # the worker silent past the grace: a sweep would demote its device

    async def take(holder: str) -> tuple[int | None, int]:
        link = await PeerLink.open(url, 5)
        try:
            return await link.take(holder, LEASE)
        finally:
            await link.close()

    assert asyncio.run(take("old"))[0] == 1
    lapse(url)
    assert asyncio.run(take("new"))[0] == 2
    for stale in (Fence("old", 1), Fence("new", 1), Fence("old", 2)):
        with pytest.raises(errors.NotLeading):
            pg_store.devices.sweep(SweepRules(), stale)
        with pytest.raises(errors.NotLeading):
            pg_store.views.logs_to_prune(0, 10, stale)
        with pytest.raises(errors.NotLeading):
            pg_store.views.mark_logs_pruned(["x"], stale)
    assert pg_store.views.devices(device)[0].device.state == "ready"  # nothing written
    assert pg_store.devices.sweep(SweepRules(), Fence("new", 2)).devices_unknown == [device]
    lapse(url)  # nobody renewed it: even its own leader's epoch no longer holds
    with pytest.raises(errors.NotLeading):
        pg_store.devices.sweep(SweepRules(), Fence("new", 2))


def test_a_fenced_write_left_open_holds_off_a_takeover_until_the_server_ends_it(
    url: str,
) -> None:
    async def take(holder: str) -> int | None:
        link = await PeerLink.open(url, 5)
        try:
            return (await link.take(holder, LEASE))[0]
        finally:
            await link.close()

    async def renew() -> bool:
        link = await PeerLink.open(url, 5)
        try:
            return (await link.renew(Fence("old", 1), LEASE))[0]
        finally:
            await link.close()

    assert asyncio.run(take("old")) == 1
    old = sql.Db(engine.connect_postgres(url), "postgresql")  # the old leader's store
    try:
        # What the server ends: a transaction idle past the takeover's budget.
        assert old.value("SHOW idle_in_transaction_session_timeout") == "3s"
        # The old leader's fenced write began; it froze before its commit, past its
        # lease. (A shorter limit here than the controllers' 3 s, not to wait it out.)
        old.execute("SET idle_in_transaction_session_timeout = '300ms'")
        old.begin()
        leadership.hold(old, Fence("old", 1))
        assert asyncio.run(renew())  # its own renewals do not wait for its write
        lapse(url)
        assert asyncio.run(take("new")) is None  # stale, but mid-write: not taken
        deadline = time.monotonic() + 10
        while (epoch := asyncio.run(take("new"))) is None:
            assert time.monotonic() < deadline, "the frozen transaction was never ended"
            time.sleep(0.05)
        assert epoch == 2 and row(url) == ("new", 2)
        with pytest.raises(psycopg.Error, match="idle-in-transaction timeout"):
            old.execute("SELECT 1")  # its session was ended: nothing of it commits
    finally:
        old.driver.close()
