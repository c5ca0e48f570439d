"""A watch on every SQL statement: a state write that bypasses ``store.moves`` is recorded.

Every statement the store runs passes ``sql.Db.execute`` (or ``Db.many``), which hands it
to ``sql.watchers`` with the move that issued it, if any. An INSERT into ``jobs`` or
``devices``, an UPDATE of either that sets ``state``, or a DELETE from either, must come
with a move label, which only ``store.moves`` passes (STORE-021, STORE-041: every state
change is a move from the transition table). A write straight on the driver's connection
would skip ``Db`` altogether; ``Store`` holds no other path to the database.
"""

from __future__ import annotations

import re

from resource_controller.store import sql

GUARDED = ("jobs", "devices")

bypasses: list[str] = []
moved: list[str] = []  # ``entity:op`` of every move seen, for the test that the guard works

_TABLE = "(" + "|".join(GUARDED) + r")\b"
_INSERT = re.compile(r"^\s*INSERT\s+(?:OR\s+\w+\s+)?INTO\s+" + _TABLE, re.I)
_DELETE = re.compile(r"^\s*DELETE\s+FROM\s+" + _TABLE, re.I)
_UPDATE = re.compile(r"^\s*UPDATE\s+" + _TABLE + r"\s+SET\s+(.*?)(?:\bWHERE\b|$)", re.I | re.S)
_SETS_STATE = re.compile(r"(?:^|,)\s*state\s*=", re.I)


def writes_state(text: str) -> bool:
    """Whether ``text`` writes a guarded table's state (an insert or delete always does)."""
    if _INSERT.match(text) or _DELETE.match(text):
        return True
    update = _UPDATE.match(text)
    return bool(update and _SETS_STATE.search(update.group(2)))


def _watch(text: str, move: str) -> None:
    if move:
        moved.append(move)
    elif writes_state(text):
        bypasses.append(text)


def install() -> None:
    if _watch not in sql.watchers:
        sql.watchers.append(_watch)
