"""The one way the store reaches its database: SQL text run on the driver's connection.

A statement through the DBAPI driver costs 2-3 µs of CPU; the same statement built
with SQLAlchemy Core costs 14 µs prebuilt and 53 µs built per call (``bench/sqlpath.py``).
A job's life takes some 40 statements, so the store writes SQL text, with ``?`` for
each parameter, and ``Db`` runs it on whichever driver is under it, translating the
placeholders once per distinct statement for drivers that want another style.
SQLAlchemy stays for what it does well here: the schema and the Alembic migrations.

Every statement passes ``Db.execute``, so that is where a watcher (the test that no
state write bypasses ``store.moves``) sees them all, each with the move that issued
it, if any.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

#: A row as the driver returns it: a tuple, read by position.
Row = Sequence[Any]


class Cursor(Protocol):
    """What the store uses of a DBAPI cursor."""

    rowcount: int

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Any: ...


#: Observers of every statement, called with its SQL text and the move that issued it
#: (``entity:op``, or ``""`` for a statement that is no move). Empty in production.
watchers: list[Callable[[str, str], None]] = []


class Db:
    """A DBAPI connection that runs the store's SQL: the caller's transaction, if any,
    is the connection's own (``Store`` begins and ends it)."""

    def __init__(self, driver: Any, paramstyle: str = "qmark") -> None:
        self.driver = driver
        self._translate = _QMARK if paramstyle == "qmark" else _to_format

    def execute(self, sql: str, params: Sequence[Any] = (), move: str = "") -> Cursor:
        """Run one statement; ``move`` names the state move it makes (``store.moves``)."""
        if watchers:
            for watch in watchers:
                watch(sql, move)
        cursor: Cursor = self.driver.execute(self._translate(sql), params)
        return cursor

    def many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run one statement once per parameter row."""
        if watchers:
            for watch in watchers:
                watch(sql, "")
        self.driver.executemany(self._translate(sql), rows)

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The first row, or None."""
        return self.execute(sql, params).fetchone()

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self.execute(sql, params).fetchall()

    def value(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The first column of the first row, or None when there is no row."""
        row = self.execute(sql, params).fetchone()
        return None if row is None else row[0]


def marks(n: int) -> str:
    """``?, ?, ...`` for ``n`` parameters, for an ``IN (...)`` list."""
    return ", ".join("?" * n)


def _qmark(sql: str) -> str:
    return sql


_QMARK = _qmark
_FORMAT: dict[str, str] = {}


def _to_format(sql: str) -> str:
    """``?`` placeholders as ``%s`` (and a literal ``%`` doubled), cached per statement.
    The store's SQL has no ``?`` inside a string literal: values are always parameters."""
    out = _FORMAT.get(sql)
    if out is None:
        out = _FORMAT[sql] = sql.replace("%", "%%").replace("?", "%s")
    return out
