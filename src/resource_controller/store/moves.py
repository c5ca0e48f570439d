"""The one way the store writes a device's or a job's state: a move from the table.

``move`` takes a machine (``transitions.DEVICE`` or ``transitions.JOB``), the operation,
the row condition and the values to write. It adds ``state IN (<the op's sources>)`` to
the condition, refuses a target state the op does not list, executes, and returns the
row count, so the caller sees whether the move happened. ``create`` and ``remove`` do
the same for the "no row" ends of the table (STORE-021, STORE-041).

Every statement built here carries the execution option ``rc_move`` = ``entity:op``,
and a debug log line names the op and how many rows it moved: that is how a reader
(or the test that fails on any state write that bypasses this module) tells why a
state changed.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from resource_controller import errors
from resource_controller.core.transitions import Machine, Op
from resource_controller.store import schema as t

log = logging.getLogger(__name__)

#: Execution option naming the move a statement makes.
MOVE_OPTION = "rc_move"

_TABLES: dict[str, sa.Table] = {"device": t.devices, "job": t.jobs}


def _table(machine: Machine) -> sa.Table:
    return _TABLES[machine.entity]


def _label(machine: Machine, op: Op) -> str:
    return f"{machine.entity}:{op.value}"


def _from_sources(machine: Machine, op: Op) -> sa.ColumnElement[bool]:
    sources = sorted(s for s in machine.move(op).sources if s is not None)
    return _table(machine).c.state.in_(sources)


def _check_target(machine: Machine, op: Op, state: object) -> None:
    if state not in machine.move(op).targets:
        raise errors.InvalidTransition(f"{op.value} cannot move a {machine.entity} to {state!r}")


def _update(
    machine: Machine, op: Op, where: Sequence[sa.ColumnElement[bool]], state: str, values: Any
) -> sa.Update:
    _check_target(machine, op, state)
    table = _table(machine)
    return (
        sa.update(table)
        .where(*where, _from_sources(machine, op))
        .values(state=state, **values)
        .execution_options(**{MOVE_OPTION: _label(machine, op)})
    )


def move(
    conn: sa.Connection,
    machine: Machine,
    op: Op,
    *where: sa.ColumnElement[bool],
    state: str,
    **values: Any,
) -> int:
    """Move the rows matching ``where`` (and the op's sources) to ``state``; the row count."""
    n = conn.execute(_update(machine, op, where, state, values)).rowcount
    log.debug("%s: %d row(s) -> %s", _label(machine, op), n, state)
    return int(n)


def create(conn: sa.Connection, machine: Machine, op: Op, values: dict[str, Any]) -> None:
    """Insert a row whose ``state`` the op allows from "no row"."""
    if None not in machine.move(op).sources:
        raise errors.InvalidTransition(f"{op.value} does not create a {machine.entity}")
    _check_target(machine, op, values.get("state"))
    stmt = (
        sa.insert(_table(machine))
        .values(**values)
        .execution_options(**{MOVE_OPTION: _label(machine, op)})
    )
    conn.execute(stmt)
    log.debug("%s: created -> %s", _label(machine, op), values.get("state"))


def remove(conn: sa.Connection, machine: Machine, op: Op, *where: sa.ColumnElement[bool]) -> int:
    """Delete the rows matching ``where`` (and the op's sources), for an op that ends in no row."""
    _check_target(machine, op, None)
    stmt = (
        sa.delete(_table(machine))
        .where(*where, _from_sources(machine, op))
        .execution_options(**{MOVE_OPTION: _label(machine, op)})
    )
    n = int(conn.execute(stmt).rowcount)
    log.debug("%s: %d row(s) removed", _label(machine, op), n)
    return n


# ---- the same moves as prebuilt SQL, for the per-job hot path (``store/fast.py``) ----

#: Observers of the fast moves, called with ``entity:op`` (the test guard's view of them).
watchers: list[Callable[[str], None]] = []

_SQL: dict[tuple[Any, ...], str] = {}


def _fast_sql(machine: Machine, op: Op, where: str, keys: tuple[str, ...], returning: str) -> str:
    """``UPDATE <table> SET state = ?, <keys> WHERE (<where>) AND state IN (<sources>)``."""
    cache = (machine.entity, op, where, keys, returning)
    sql = _SQL.get(cache)
    if sql is None:
        sources = sorted(str(s) for s in machine.move(op).sources if s is not None)
        assigns = ", ".join(["state = ?", *(f"{k} = ?" for k in keys)])
        in_sources = ", ".join(f"'{s}'" for s in sources)
        sql = f"UPDATE {_table(machine).name} SET {assigns} WHERE ({where}) AND state IN ({in_sources})"
        if returning:
            sql += f" RETURNING {returning}"
        _SQL[cache] = sql
    return sql


def _seen(machine: Machine, op: Op, n: int, state: object) -> None:
    label = _label(machine, op)
    for watch in watchers:
        watch(label)
    log.debug("%s: %d row(s) -> %s", label, n, state)


def move_fast(
    db: sqlite3.Connection,
    machine: Machine,
    op: Op,
    where: str,
    params: Sequence[Any],
    *,
    state: str,
    **values: Any,
) -> int:
    """As ``move`` with the condition as SQL text (``where``, ``?`` for ``params``), run
    on the driver's connection; the row count."""
    _check_target(machine, op, state)
    keys = tuple(values)
    sql = _fast_sql(machine, op, where, keys, "")
    n = int(db.execute(sql, (str(state), *(values[k] for k in keys), *params)).rowcount)
    _seen(machine, op, n, state)
    return n


def move_fast_returning(
    db: sqlite3.Connection,
    machine: Machine,
    op: Op,
    where: str,
    params: Sequence[Any],
    returning: str,
    *,
    state: str,
    **values: Any,
) -> list[Any]:
    """As ``move_fast``, returning the moved rows' ``returning`` columns (SQL text)."""
    _check_target(machine, op, state)
    keys = tuple(values)
    sql = _fast_sql(machine, op, where, keys, returning)
    rows = db.execute(sql, (str(state), *(values[k] for k in keys), *params)).fetchall()
    _seen(machine, op, len(rows), state)
    return rows


def create_fast(db: sqlite3.Connection, machine: Machine, op: Op, values: dict[str, Any]) -> None:
    """As ``create``, on the driver's connection."""
    if None not in machine.move(op).sources:
        raise errors.InvalidTransition(f"{op.value} does not create a {machine.entity}")
    _check_target(machine, op, values.get("state"))
    cols = tuple(values)
    sql = _SQL.get(("create", machine.entity, cols))
    if sql is None:
        marks = ", ".join("?" * len(cols))
        sql = f"INSERT INTO {_table(machine).name} ({', '.join(cols)}) VALUES ({marks})"
        _SQL[("create", machine.entity, cols)] = sql
    db.execute(sql, tuple(values[c] for c in cols))
    label = _label(machine, op)
    for watch in watchers:
        watch(label)
    log.debug("%s: created -> %s", label, values.get("state"))
