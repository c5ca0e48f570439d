"""The store's core under every aggregate: connection, lock, transactions and caches; a rolled-back
transaction drops what the caches took from it (``undone``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext, suppress
from pathlib import Path

from resource_controller import crashpoints, errors
from resource_controller.clock import Clock
from resource_controller.core import preempt, scheduling, share
from resource_controller.store import engine, fleet, passes, races, sql


class _Serial:
    """The store's re-entrant lock, which also knows when an operation starts."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0
        self._fresh = False

    def __enter__(self) -> None:
        self._lock.acquire()
        self._depth += 1
        self._fresh = self._fresh or self._depth == 1

    def __exit__(self, *_: object) -> None:
        self._depth -= 1
        self._lock.release()

    def starting(self) -> bool:
        """True at the first call under each outermost hold, False after."""
        fresh, self._fresh = self._fresh, False
        return fresh


class Core:
    """One connection behind serialised transactions, and what operations keep between them."""

    def __init__(self, database: Path | str, clock: Clock, priority_aging: int = 0) -> None:
        """``database``: a SQLite file's path, or a ``postgresql://`` URL."""
        self.clock = clock
        #: Seconds of waiting per step of effective priority; 0 = off.
        self.aging = max(0, int(priority_aging))
        self.database = engine.Database.at(database)
        driver = engine.open_driver(self.database)
        try:
            engine.migrate(self.database, driver)
        except BaseException:
            driver.close()
            raise
        #: The PostgreSQL database as a libpq URL, for the controllers' own links; None on SQLite.
        self.database_url = self.database.libpq_url
        self.db = sql.Db(driver, self.database.dialect)
        self.lock = _Serial()
        self._closed = False
        #: Transactions this store has run (each may have written), for ``schedule_after``.
        self.gen = 0
        #: What the last pass left, for skipping the pass after a submit.
        self.settled = passes.SettledQueue()
        #: The devices as the pass reads them, reread only where they changed.
        self.fleet = fleet.FleetSnapshot()
        #: The reservation rows the last pass left, kept so the next need not read them.
        self.reserved = passes.KeptReservations()
        #: The submitter limits, set by the controller (again when the file is reread).
        self.limits = share.NO_LIMITS
        #: ``rc serve --preemption``, ``--preempt-min-runtime`` (EXT-PREEMPT-1, -3).
        self.preemption = preempt.Settings()

    def key(self, now: int) -> scheduling.QueueKey:
        """The queue order at ``now``: aged when ``--priority-aging`` is on."""
        return scheduling.aged_queue_key(now, self.aging)

    def close(self) -> None:
        with self.lock:
            self._closed = True
            self.db.driver.close()

    def now(self) -> int:
        return int(self.clock.now())

    @races.reconnecting
    def ping(self) -> None:
        """One cheap read; raises when the store cannot answer."""
        with self.read() as c:
            c.value("SELECT 1")

    def _usable(self) -> sql.Db:
        """The connection for an operation: one dropped while idle is replaced at its start; later a
        drop ends the operation (``ConnectionDropped``), as what ran may rest on the old session."""
        starting = self.lock.starting()
        if not self.db.broken and not (starting and engine.dropped(self.db.driver)):
            return self.db
        if self._closed:
            raise errors.StoreError("the store is closed")
        if not starting:
            raise errors.ConnectionDropped("the database connection dropped")
        with suppress(Exception):  # already gone with the server
            self.db.driver.close()
        try:
            driver = engine.open_driver(self.database)
        except Exception as exc:
            raise errors.StoreUnavailable("the database cannot be reached") from exc
        self.db = sql.Db(driver, self.database.dialect)
        self.fleet.forget()
        self.reserved.forget()
        self.settled.forget()
        return self.db

    def _failed(self, exc: BaseException) -> errors.StoreError:
        """The error a driver failure becomes: ``ConnectionDropped`` when the link went with it."""
        if self.db.broken:
            return errors.ConnectionDropped("the database connection dropped")
        return errors.StoreError(f"database error: {type(exc).__name__}")

    @contextmanager
    def tx(self, point: str = "") -> Iterator[sql.Db]:
        """One transaction under the lock; a connection lost at the commit is ``StoreUnavailable``:
        whether it committed is unknown, so it never runs again."""
        with self.lock:
            self.gen += 1
            db = self._usable()
            committing = False
            try:
                db.begin()
                try:
                    with self.undone(db):
                        yield db
                        crashpoints.hit(point, ".before_commit")
                        if db.broken:  # a failure the operation went on past: no commit
                            raise errors.ConnectionDropped("the database connection dropped")
                        committing = True
                        db.commit()
                except BaseException:
                    if not db.broken:  # else the transaction went with the connection
                        db.rollback()
                    raise
                crashpoints.hit(point, ".after_commit")
            except errors.RcError:
                raise
            except db.errors as exc:
                if committing and db.broken:
                    raise errors.StoreUnavailable(
                        "the database connection dropped at a commit: whether it committed"
                        " is unknown"
                    ) from exc
                raise self._failed(exc) from exc

    @contextmanager
    def undone(self, db: sql.Db, savepoint: str = "") -> Iterator[None]:
        """A transaction (or a savepoint of one): if it fails, the caches drop what they took."""
        seen = self.fleet.seen
        try:
            with db.savepoint(savepoint) if savepoint else nullcontext():
                yield
        except BaseException:
            self.fleet.rolled_back(seen)
            self.reserved.forget()
            self.settled.forget()
            raise

    @contextmanager
    def read(self) -> Iterator[sql.Db]:
        """Reads under the lock outside any transaction: each statement sees the last commit."""
        with self.lock:
            db = self._usable()
            try:
                yield db
            except db.errors as exc:
                raise self._failed(exc) from exc
