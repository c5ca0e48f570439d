"""The one way the store writes a device's or a job's state: a move from the table.

``move`` takes a machine (``transitions.DEVICE`` or ``transitions.JOB``), the operation,
the row condition and the values to write. It adds ``state IN (<the op's sources>)`` to
the condition, refuses a target state the op does not list, executes, and returns the
row count, so the caller sees whether the move happened. ``create`` and ``remove`` do
the same for the "no row" ends of the table; ``end_job`` and ``set_devices`` are the
two moves most ops make (a job ended with its reason, devices with their quarantine).

Every statement built here reaches ``sql.Db.execute`` labelled ``entity:op``, and a
debug log line names the op and how many rows it moved: that is how a reader (or the
test that fails on any state write that bypasses this module) tells why a state
changed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from resource_controller import errors
from resource_controller.core.transitions import DEVICE, JOB, Machine, Op
from resource_controller.store import sql

log = logging.getLogger(__name__)

_TABLES: dict[str, str] = {"device": "devices", "job": "jobs"}


def _label(machine: Machine, op: Op) -> str:
    return f"{machine.entity}:{op.value}"


def _check_target(machine: Machine, op: Op, state: object) -> None:
    if state not in machine.move(op).targets:
        raise errors.InvalidTransition(f"{op.value} cannot move a {machine.entity} to {state!r}")


_SQL: dict[tuple[Any, ...], str] = {}


def _in_sources(machine: Machine, op: Op) -> str:
    """``state IN (<the op's source states>)``; ``FALSE`` for an op only from no row."""
    sources = sorted(str(s) for s in machine.move(op).sources if s is not None)
    if not sources:
        return "FALSE"
    return "state IN (" + ", ".join(f"'{s}'" for s in sources) + ")"


def _update_sql(machine: Machine, op: Op, where: str, keys: tuple[str, ...], returning: str) -> str:
    """``UPDATE <table> SET state = ?, <keys> WHERE (<where>) AND state IN (<sources>)``."""
    cache = (machine.entity, op, where, keys, returning)
    text = _SQL.get(cache)
    if text is None:
        assigns = ", ".join(["state = ?", *(f"{k} = ?" for k in keys)])
        text = f"UPDATE {_TABLES[machine.entity]} SET {assigns} WHERE ({where}) AND {_in_sources(machine, op)}"
        if returning:
            text += f" RETURNING {returning}"
        _SQL[cache] = text
    return text


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
    """The move's one statement, run."""
    _check_target(machine, op, state)
    keys = tuple(values)
    text = _update_sql(machine, op, where, keys, returning)
    return db.execute(text, (str(state), *(values[k] for k in keys), *params), _label(machine, op))


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
    """Move the rows matching ``where`` (SQL text, ``?`` for each of ``params``) and the
    op's sources to ``state``, writing ``values`` beside it; the row count."""
    n = int(_update(db, machine, op, where, params, "", state, values).rowcount)
    log.debug("%s: %d row(s) -> %s", _label(machine, op), n, state)
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
    log.debug("%s: %d row(s) -> %s", _label(machine, op), len(rows), state)
    return rows


def create(db: sql.Db, machine: Machine, op: Op, values: dict[str, Any]) -> None:
    """Insert a row whose ``state`` the op allows from "no row"."""
    if None not in machine.move(op).sources:
        raise errors.InvalidTransition(f"{op.value} does not create a {machine.entity}")
    _check_target(machine, op, values.get("state"))
    cols = tuple(values)
    text = _SQL.get(("create", machine.entity, cols))
    if text is None:
        marks = ", ".join("?" * len(cols))
        text = f"INSERT INTO {_TABLES[machine.entity]} ({', '.join(cols)}) VALUES ({marks})"
        _SQL[("create", machine.entity, cols)] = text
    label = _label(machine, op)
    db.execute(text, tuple(values[c] for c in cols), label)
    log.debug("%s: created -> %s", label, values.get("state"))


def remove(db: sql.Db, machine: Machine, op: Op, where: str, params: Sequence[Any]) -> int:
    """Delete the rows matching ``where`` and the op's sources, for an op that ends in no row."""
    _check_target(machine, op, None)
    label = _label(machine, op)
    text = _SQL.get(("remove", machine.entity, op, where))
    if text is None:
        text = (
            f"DELETE FROM {_TABLES[machine.entity]} WHERE ({where}) AND {_in_sources(machine, op)}"
        )
        _SQL[("remove", machine.entity, op, where)] = text
    n = int(db.execute(text, tuple(params), label).rowcount)
    log.debug("%s: %d row(s) removed", label, n)
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
    no detail (STORE-032), and ``values``; the row count."""
    return move(
        db,
        DEVICE,
        op,
        where,
        params,
        state=state,
        quarantine_reason=reason,
        quarantine_detail="",
        **values,
    )
