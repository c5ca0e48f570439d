"""A watch on every SQL statement: a state write that bypasses ``store.moves`` is recorded.

Listens on the ``Engine`` class, so it sees every store opened while a test runs (and
``moves.watchers`` for the moves ``moves`` runs as prebuilt SQL on the driver). An
INSERT or UPDATE of ``jobs`` or ``devices`` that sets ``state``, or a DELETE of either,
must carry the ``rc_move`` execution option that only ``store.moves`` sets (STORE-021,
STORE-041: every state change is a move from the transition table).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql import dml

from resource_controller.store import moves
from resource_controller.store.moves import MOVE_OPTION

GUARDED = ("jobs", "devices")

bypasses: list[str] = []
moved: list[str] = []  # ``entity:op`` of every move seen, for the test that the guard works


def _sets_state(stmt: dml.UpdateBase, multiparams: Any, params: Any) -> bool:
    if isinstance(stmt, dml.Delete):
        return True
    if "state" in stmt.compile().params:
        return True
    batches = multiparams if isinstance(multiparams, list | tuple) else [multiparams]
    return any(isinstance(b, dict) and "state" in b for b in [*batches, params])


def _before_execute(
    conn: sa.Connection,
    clauseelement: Any,
    multiparams: Any,
    params: Any,
    execution_options: Any,
) -> None:
    if not isinstance(clauseelement, dml.UpdateBase):
        return
    table = getattr(clauseelement, "table", None)
    if getattr(table, "name", None) not in GUARDED:
        return
    label = clauseelement.get_execution_options().get(MOVE_OPTION)
    if label:
        moved.append(label)
        return
    if _sets_state(clauseelement, multiparams, params):
        bypasses.append(str(clauseelement))


def install() -> None:
    if not sa.event.contains(sa.engine.Engine, "before_execute", _before_execute):
        sa.event.listen(sa.engine.Engine, "before_execute", _before_execute)
    # The hot path's prebuilt moves run on the driver's connection, past the engine's
    # events; ``moves`` reports each of them to its watchers.
    if moved.append not in moves.watchers:
        moves.watchers.append(moved.append)
