"""job_logs and log_chunks: job output in the database, for several controllers

On PostgreSQL every controller of a fleet must read the output any of them stored
, so it lives in the database (``store/logrows.py``): a row per job (the
head's length, and how many bytes the capped tail was ever given) and a row per chunk.
SQLite keeps its files; the tables exist there too, empty, so both schemas are one.

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
