"""The one way the store reaches its database: SQL text with ``?`` on the driver's connection (2-3
µs a statement, ``bench/sqlpath.py``)."""

from __future__ import annotations

import functools
import sqlite3
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol


class Cursor(Protocol):
    """What the store uses of a DBAPI cursor."""

    rowcount: int

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Any: ...


#: Observers of every statement and the move that issued it (``entity:op`` or ""); test-only.
watchers: list[Callable[[str, str], None]] = []


class Db:
    """A DBAPI connection in autocommit that runs the store's SQL; the store opens and
    ends every transaction itself, so a statement outside one holds nothing."""

    def __init__(self, driver: Any, dialect: str = "sqlite") -> None:
        self.driver = driver
        #: ``sqlite`` or ``postgresql``: where the store's SQL differs, it asks this.
        self.dialect = dialect
        self.postgres = dialect == "postgresql"
        self._translate = _to_format if self.postgres else str
        # SQLite: take the write lock at once, so no transaction fails half-way for want of it.
        self._begin = "BEGIN" if self.postgres else "BEGIN IMMEDIATE"
        #: What the driver raises for a database error, and for a broken constraint.
        self.errors: tuple[type[Exception], ...] = (sqlite3.Error,)
        self.integrity_errors: tuple[type[Exception], ...] = (sqlite3.IntegrityError,)
        if self.postgres:
            import psycopg

            self.errors = (psycopg.Error,)
            self.integrity_errors = (psycopg.IntegrityError,)

    @property
    def broken(self) -> bool:
        """The connection to the server is lost (PostgreSQL); it must be opened again."""
        return self.postgres and bool(self.driver.broken or self.driver.closed)

    def begin(self) -> None:
        self.driver.execute(self._begin)

    def commit(self) -> None:
        self.driver.execute("COMMIT")

    def rollback(self) -> None:
        if self.in_transaction:
            self.driver.execute("ROLLBACK")

    @contextmanager
    def savepoint(self, name: str) -> Iterator[Db]:
        """A part of the open transaction that can fail alone: on an exception what it
        wrote is undone and the transaction goes on (both databases allow it)."""
        self.driver.execute(f"SAVEPOINT {name}")
        try:
            yield self
        except BaseException:
            self.driver.execute(f"ROLLBACK TO SAVEPOINT {name}")
            self.driver.execute(f"RELEASE SAVEPOINT {name}")
            raise
        self.driver.execute(f"RELEASE SAVEPOINT {name}")

    @property
    def in_transaction(self) -> bool:
        if self.postgres:
            import psycopg.pq

            return bool(self.driver.info.transaction_status != psycopg.pq.TransactionStatus.IDLE)
        return bool(self.driver.in_transaction)

    def exclusive_until_commit(self, key: int) -> None:
        """One holder of ``key`` at a time among the controllers, to the end of the open
        transaction (PostgreSQL's advisory lock; on SQLite the write lock is enough)."""
        if self.postgres:
            self.driver.execute("SELECT pg_advisory_xact_lock(%s)", (key,))

    def data_version(self) -> int | None:
        """A number that changes whenever another connection commits (SQLite's pragma);
        None where the database has no such thing, and a cache must not lean on it."""
        if self.postgres:
            return None
        (version,) = self.driver.execute("PRAGMA data_version").fetchone()
        return int(version)

    def quiet_mark(self) -> int | None:
        """PostgreSQL: a commit mark that is one more only if a single transaction finished
        meanwhile; None when unknown (always on SQLite)."""
        if not self.postgres:
            return None
        (mark,) = self.driver.execute(_QUIET_MARK).fetchone() or (None,)
        return None if mark is None else int(mark)

    def execute(self, sql: str, params: Sequence[Any] = (), move: str = "") -> Cursor:
        """Run one statement; ``move`` names the state move it makes (``store.moves``)."""
        for watch in watchers:
            watch(sql, move)
        cursor: Cursor = self.driver.execute(self._translate(sql), params)
        return cursor

    def many(self, sql: str, rows: Iterable[Sequence[Any]], move: str = "") -> None:
        """Run one statement once per parameter row; ``move`` as for ``execute``."""
        for watch in watchers:
            watch(sql, move)
        if self.postgres:
            with self.driver.cursor() as cursor:
                cursor.executemany(self._translate(sql), list(rows))
        else:
            self.driver.executemany(self._translate(sql), rows)

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.execute(sql, params).fetchone()

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self.execute(sql, params).fetchall()

    def value(self, sql: str, params: Sequence[Any] = ()) -> Any:
        (first, *_) = self.execute(sql, params).fetchone() or (None,)
        return first


_QUIET_MARK = (
    "SELECT CASE WHEN pg_snapshot_xmin(s) = pg_snapshot_xmax(s)"
    " THEN pg_snapshot_xmax(s)::text::bigint END FROM pg_current_snapshot() AS s"
)


def marks(n: int) -> str:
    """``?, ?, ...`` for ``n`` parameters, for an ``IN (...)`` list."""
    return ", ".join("?" * n)


def driver_error(exc: BaseException) -> bool:
    """``exc`` is the database driver's (SQLite's or psycopg's), not the store's own."""
    return _driver_raised(exc, "Error")


#: SQLSTATEs of a transaction that lost a race (serialization failure, deadlock): run it again.
LOST_RACE = frozenset({"40001", "40P01"})


def lost_race(exc: BaseException | None) -> bool:
    """``exc`` is PostgreSQL rolling a transaction back for a race with another
    connection (another controller's): the transaction may simply run again."""
    return getattr(exc, "sqlstate", None) in LOST_RACE


def row_error(exc: BaseException) -> bool:
    """``exc`` is a fault of one row's data (a value out of range, a broken constraint),
    not of the database: the scheduling pass skips that job and goes on."""
    return _driver_raised(exc, "DataError", "IntegrityError")


def _driver_raised(exc: BaseException, *kinds: str) -> bool:
    """``exc`` is one of the DBAPI exception ``kinds`` of SQLite or of psycopg (loaded only
    when a PostgreSQL store opened)."""
    drivers = [sqlite3, sys.modules.get("psycopg")]
    return any(isinstance(exc, getattr(d, k)) for d in drivers if d is not None for k in kinds)


@functools.lru_cache(maxsize=4096)
def _to_format(sql: str) -> str:
    """``?`` as ``%s`` (``%`` doubled), cached; the store's SQL has no ``?`` in a literal."""
    return sql.replace("%", "%%").replace("?", "%s")
