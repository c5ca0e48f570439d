"""jobs.device_ids: the devices of a several-device job

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    # Every job before this revision held one device: '' (read as [device_id]) is right.
    op.add_column("jobs", sa.Column("device_ids", sa.Text(), server_default="", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("device_ids")
