"""leadership: the lease of the controller that leads (EXT-PG-8, ``store/leadership.py``)

One row: which controller leads, its epoch, the server session that renews it, and when
its lease ends on the database's clock. A session advisory lock named the leader before;
a frozen controller keeps its session, and the lock with it, for as long as the kernel
keeps its connection, so nobody took over. The row is created on SQLite too, where one
controller leads without it, so that both stores have the same schema.

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
