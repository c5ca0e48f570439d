"""``max_runtime`` columns say their unit: ``jobs.max_runtime_seconds``, ``devices.max_runtime_seconds``

Renamed in place, not through a copied table: migration 0010's triggers name ``jobs``,
and both databases carry a renamed column into the triggers that name it.

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
