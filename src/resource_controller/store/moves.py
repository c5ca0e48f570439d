"""The one way the store writes a state: a move adds the op's sources to its condition, so the row
count says whether it happened; each statement is labelled ``entity:op``."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from resource_controller import errors
from resource_controller.core.transitions import DEVICE, JOB, Machine, Op
from resource_controller.store import sql

log = logging.getLogger(__name__)

_TABLES: dict[str, str] = {"device": "devices", "job": "jobs"}
#: Statements built, by what built them.
_SQL: dict[tuple[Any, ...], str] = {}


def _check_target(machine: Machine, op: Op, state: object) -> None:
    if state not in machine.move(op).targets:
        raise errors.InvalidTransition(f"{op.value} cannot move a {machine.entity} to {state!r}")


def _in_sources(machine: Machine, op: Op) -> str:
    """``state IN (<the op's source states>)``; ``FALSE`` for an op only from no row."""
    sources = sorted(str(s) for s in machine.move(op).sources if s is not None)
    return "state IN (" + ", ".join(f"'{s}'" for s in sources) + ")" if sources else "FALSE"


def _run(
    db: sql.Db, machine: Machine, op: Op, key: tuple[Any, ...], build: Any, params: Sequence[Any]
) -> sql.Cursor:
    text = _SQL.get(key)
    if text is None:
        text = _SQL[key] = build(_TABLES[machine.entity])
    return db.execute(text, tuple(params), f"{machine.entity}:{op.value}")


def _update(
    db: sql.Db,
    machine: Machine,
    op: Op,
    where: str,
    params: Sequence[Any],
    returning: str,
    state: str,
    values: dict[str, Any],
) -> sql.Cursor:
    """``UPDATE <table> SET state = ?, <values> WHERE (<where>) AND <the op's sources>``."""
    _check_target(machine, op, state)
    keys = tuple(values)

    def build(table: str) -> str:
        assigns = ", ".join(["state = ?", *(f"{k} = ?" for k in keys)])
        text = f"UPDATE {table} SET {assigns} WHERE ({where}) AND {_in_sources(machine, op)}"
        return text + (f" RETURNING {returning}" if returning else "")

    args = (str(state), *(values[k] for k in keys), *params)
    return _run(db, machine, op, (machine.entity, op, where, keys, returning), build, args)


def move(
    db: sql.Db,
    machine: Machine,
    op: Op,
    where: str,
    params: Sequence[Any],
    *,
    state: str,
    **values: Any,
) -> int:
    """Move the rows matching ``where`` (``?`` for each of ``params``) and the op's
    sources to ``state``, writing ``values`` beside it; the row count."""
    n = int(_update(db, machine, op, where, params, "", state, values).rowcount)
    log.debug("%s:%s: %d row(s) -> %s", machine.entity, op.value, n, state)
    return n


def move_returning(
    db: sql.Db,
    machine: Machine,
    op: Op,
    where: str,
    params: Sequence[Any],
    returning: str,
    *,
    state: str,
    **values: Any,
) -> list[Any]:
    """As ``move``, returning the moved rows' ``returning`` columns (SQL text)."""
    rows = _update(db, machine, op, where, params, returning, state, values).fetchall()
    log.debug("%s:%s: %d row(s) -> %s", machine.entity, op.value, len(rows), state)
    return rows


def create(db: sql.Db, machine: Machine, op: Op, *rows: dict[str, Any]) -> None:
    """Insert rows (each with the same columns) whose ``state`` the op allows from "no row"."""
    if None not in machine.move(op).sources:
        raise errors.InvalidTransition(f"{op.value} does not create a {machine.entity}")
    for values in rows:
        _check_target(machine, op, values.get("state"))
    cols = tuple(rows[0])
    key = ("create", machine.entity, cols)
    text = _SQL.get(key)
    if text is None:
        marks = sql.marks(len(cols))
        text = _SQL[key] = (
            f"INSERT INTO {_TABLES[machine.entity]} ({', '.join(cols)}) VALUES ({marks})"
        )
    db.many(text, [[values[c] for c in cols] for values in rows], f"{machine.entity}:{op.value}")
    log.debug("%s:%s: created %d -> %s", machine.entity, op.value, len(rows), rows[0].get("state"))


def remove(db: sql.Db, machine: Machine, op: Op, where: str, params: Sequence[Any]) -> int:
    """Delete the rows matching ``where`` and the op's sources, for an op that ends in no row."""
    _check_target(machine, op, None)

    def build(table: str) -> str:
        return f"DELETE FROM {table} WHERE ({where}) AND {_in_sources(machine, op)}"

    n = int(_run(db, machine, op, ("remove", machine.entity, op, where), build, params).rowcount)
    log.debug("%s:%s: %d row(s) removed", machine.entity, op.value, n)
    return n


def end_job(
    db: sql.Db, op: Op, job_id: str, state: str, reason: str, now: int, **values: Any
) -> int:
    """``move`` of one job to the terminal ``state``, with its reason and its end
    (STORE-041: ``kill_reason``, ``finished_at``) and ``values``; 1 when it moved."""
    return move(
        db, JOB, op, "id = ?", (job_id,), state=state, kill_reason=reason, finished_at=now, **values
    )


def set_devices(
    db: sql.Db,
    op: Op,
    where: str,
    params: Sequence[Any],
    state: str,
    reason: str = "",
    **values: Any,
) -> int:
    """``move`` of devices to ``state`` with the quarantine ``reason`` ('' out of one) and
    no detail unless ``values`` gives one (STORE-032); the row count."""
    values = {"quarantine_reason": reason, "quarantine_detail": "", **values}
    return move(db, DEVICE, op, where, params, state=state, **values)
