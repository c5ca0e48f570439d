"""job_logs and log_chunks: job output in the database, for several controllers

Every controller must read the output any stored (``store/logrows.py``); SQLite keeps
its files, with the tables empty, so both schemas are one.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"


def upgrade() -> None:
    op.create_table(
        "job_logs",
        sa.Column("job_id", sa.Text, primary_key=True),
        sa.Column("head_bytes", sa.BigInteger, nullable=False),
        sa.Column("tail_written", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "log_chunks",
        sa.Column("job_id", sa.Text, primary_key=True),
        sa.Column("part", sa.SmallInteger, primary_key=True),
        sa.Column("at", sa.BigInteger, primary_key=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("log_chunks")
    op.drop_table("job_logs")
