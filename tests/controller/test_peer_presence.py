"""Presence on a real PostgreSQL database: each controller's listening connection
counts the controllers listening there, so a lone one knows it is alone."""

from __future__ import annotations

import asyncio

from resource_controller.store.peering import PeerLink
from support import pg


def test_links_count_the_listening_controllers_of_their_database_only(
    pg_cluster: pg.Cluster,
) -> None:
    url, elsewhere = pg_cluster.fresh_database(), pg_cluster.fresh_database()

    async def go() -> None:
        a = await PeerLink.open(url, 5)
        b = await PeerLink.open(url, 5)
        other = await PeerLink.open(elsewhere, 5)
        try:
            # B leads (a long lease, its session alive): A's tries take nothing and count.
            await a.listen()
            assert await b.take("b", 600) == (1, 1)
            assert await a.take("a", 600) == (None, 1)
            await other.listen()  # another database's controller is not counted
            assert await a.take("a", 600) == (None, 1)
            await b.listen()
            assert await a.take("a", 600) == (None, 2)
            await b.close()  # its server session ends a moment after: wait (bounded)
            async with asyncio.timeout(10):
                while (await a.take("a", 600))[1] != 1:
                    await asyncio.sleep(0.01)
        finally:
            for link in (a, b, other):
                await link.close()

    asyncio.run(go())
