"""device drain flag

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    # A flag beside the state, with who, when and why; every existing device is not draining.
    with op.batch_alter_table("devices", schema=None) as batch_op:
        batch_op.add_column(sa.Column("draining", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("drained_by", sa.Text(), server_default="", nullable=False))
        batch_op.add_column(
            sa.Column("drained_at", sa.BigInteger(), server_default="0", nullable=False)
        )
        batch_op.add_column(sa.Column("drain_reason", sa.Text(), server_default="", nullable=False))
