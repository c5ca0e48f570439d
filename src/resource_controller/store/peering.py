"""A controller's own asyncio PostgreSQL connection; every driver failure is ``ConnectionError``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from resource_controller.store import engine, leadership, locks

#: The LISTEN/NOTIFY channel of wake-ups.
CHANNEL = "rc_wake"

T = TypeVar("T")


#: The controllers listening here: sessions holding ``locks.PRESENT`` (``objid`` in ``pg_locks``).
_PRESENT = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
    " AND mode = 'ShareLock' AND classid = 0 AND objsubid = 1"
    f" AND objid = {locks.PRESENT}"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


def _gone(exc: Exception) -> ConnectionError:
    return ConnectionError(engine.first_line(exc))


def _forget(task: asyncio.Future[Any]) -> None:
    """Collect an abandoned call's end, so that nothing reports it as never retrieved."""
    with contextlib.suppress(BaseException):
        task.exception()


class PeerLink:
    """One autocommit connection: try or check leadership, send and receive wake-ups."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    @classmethod
    async def open(cls, url: str, bound: float, idle: float = 0) -> PeerLink:
        """Connect within ``bound`` seconds; ``idle`` ends the session of a frozen controller, whose
        LISTEN would hold back everyone's notifications."""
        import psycopg

        settings = dict(engine.SESSION)
        if idle:
            settings["idle_session_timeout"] = f"{int(idle * 1000)}ms"
        try:
            async with asyncio.timeout(bound):
                conn = await psycopg.AsyncConnection.connect(
                    engine.conninfo(url), autocommit=True, connect_timeout=max(2, int(bound))
                )
                try:
                    await conn.execute(engine.session_settings(settings))
                except BaseException:
                    await conn.close()
                    raise
        except psycopg.Error as exc:
            raise _gone(exc) from exc
        return cls(conn)

    @property
    def closed(self) -> bool:
        return bool(self._conn.closed)

    async def within(self, bound: float, call: Awaitable[T]) -> T:
        """``call`` within ``bound`` seconds, else drop the connection and raise ``ConnectionError``
        (psycopg may wait ten seconds more on a cancel)."""
        task = asyncio.ensure_future(call)
        done, _ = await asyncio.wait({task}, timeout=bound)
        if task in done:
            return task.result()
        self._conn.pgconn.finish()  # the socket closes: nothing waits on the server
        task.add_done_callback(_forget)
        task.cancel()
        raise ConnectionError(f"no answer from the database within {bound:g} s")

    async def _run(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        import psycopg

        try:
            cursor = await self._conn.execute(sql, params)
            return await cursor.fetchone() if cursor.description else None
        except psycopg.Error as exc:
            raise _gone(exc) from exc

    async def take(self, holder: str, lease: float) -> tuple[int | None, int]:
        """Take the leadership lease for ``holder`` if it is free (``leadership.TAKE``):
        the new epoch, else None; and how many controllers are present."""
        epoch, present = await self._run(
            f"WITH taken AS ({leadership.TAKE}) SELECT (SELECT epoch FROM taken), ({_PRESENT})",
            (holder, lease),
        )
        return (None if epoch is None else int(epoch)), int(present)

    async def renew(self, fence: leadership.Fence, lease: float) -> tuple[bool, int]:
        """Renew the lease ``fence`` holds for ``lease`` seconds more: False once it is
        lost (lapsed, or taken); and how many controllers are present."""
        epoch, present = await self._run(
            f"WITH kept AS ({leadership.RENEW}) SELECT (SELECT epoch FROM kept), ({_PRESENT})",
            (lease, fence.holder, fence.epoch),
        )
        return epoch is not None, int(present)

    async def listen(self) -> None:
        """Receive wake-ups, then say so: present (``locks.PRESENT``) means listening."""
        await self._run(f"LISTEN {CHANNEL}")
        await self._run("SELECT pg_advisory_lock_shared(%s)", (locks.PRESENT,))

    async def notify(self, payload: str) -> None:
        await self._run("SELECT pg_notify(%s, %s)", (CHANNEL, payload))

    async def received(self, timeout: float) -> AsyncIterator[str]:
        import psycopg

        try:
            async for note in self._conn.notifies(timeout=timeout):
                yield note.payload
        except psycopg.Error as exc:
            raise _gone(exc) from exc

    async def close(self) -> None:
        with contextlib.suppress(Exception):  # already gone
            await self._conn.close()
