"""leadership: the lease of the controller that leads (EXT-PG-8, ``store/leadership.py``)

One row: who leads, its epoch, the session renewing it, the end of its lease; created
on SQLite too, so both stores have the same schema.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"


def upgrade() -> None:
    op.create_table(
        "leadership",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("holder", sa.Text, nullable=False, server_default=""),
        sa.Column("epoch", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("backend", sa.Integer, nullable=False, server_default="0"),
        sa.Column("expires_at", sa.Float, nullable=False, server_default="0"),
    )
    op.execute("INSERT INTO leadership (id) VALUES (1)")


def downgrade() -> None:
    op.drop_table("leadership")
