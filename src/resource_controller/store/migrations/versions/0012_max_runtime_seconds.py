"""``max_runtime`` columns say their unit: ``jobs.max_runtime_seconds``, ``devices.max_runtime_seconds``

The flag, the wire field and the code already say ``max_runtime_seconds``; the columns
now do too, so a row, its record and the JSON it becomes use one name.

Renamed in place (``ALTER TABLE ... RENAME COLUMN``, the same statement on SQLite and
PostgreSQL), not through a copied table: migration 0010's triggers name ``jobs``, and
SQLite rewrites the triggers that name a renamed column (migration 0008's
``devices_noted_update``) itself; PostgreSQL's triggers refer to columns by number.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"

_TABLES = ("jobs", "devices")


def _rename(old: str, new: str) -> None:
    for table in _TABLES:
        op.execute(f"ALTER TABLE {table} RENAME COLUMN {old} TO {new}")


def upgrade() -> None:
    _rename("max_runtime", "max_runtime_seconds")


def downgrade() -> None:
    _rename("max_runtime_seconds", "max_runtime")
