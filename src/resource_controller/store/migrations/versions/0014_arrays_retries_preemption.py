"""Sweeps, retries and preemption (EXT-ARRAY, EXT-RETRY, EXT-PREEMPT)

``jobs`` gains its attempt count and retry rule, the devices its latest attempt failed on,
whether its devices were named (a requeue keeps them), its array and index, and whether and how it may be preempted; ``arrays`` holds each array
submitted in one request; ``job_attempts`` every attempt that ended and sent its job back to
the queue (the current attempt lives on the job row).

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"

_JOB_COLUMNS = (
    sa.Column("attempt", sa.Integer, nullable=False, server_default="1"),
    sa.Column("retries", sa.Integer, nullable=False, server_default="0"),
    sa.Column("retry_on", sa.Text, nullable=False, server_default="lost"),
    sa.Column("preemptions", sa.Integer, nullable=False, server_default="0"),
    sa.Column("avoid_device_ids", sa.Text, nullable=False, server_default=""),
    sa.Column("pinned", sa.Integer, nullable=False, server_default="0"),
    sa.Column("array_id", sa.Text, nullable=False, server_default=""),
    sa.Column("array_index", sa.Integer, nullable=True),
    sa.Column("preemptible", sa.Integer, nullable=False, server_default="0"),
    sa.Column("no_requeue", sa.Integer, nullable=False, server_default="0"),
    sa.Column("preempt_grace_seconds", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("preempted_by", sa.Text, nullable=False, server_default=""),
)


def upgrade() -> None:
    # One column at a time, not through a copied table: migration 0010's triggers name ``jobs``.
    for column in _JOB_COLUMNS:
        op.add_column("jobs", column)
    op.create_index(
        "jobs_array",
        "jobs",
        ["array_id", "array_index"],
        sqlite_where=sa.text("array_id != ''"),
        postgresql_where=sa.text("array_id != ''"),
    )
    op.create_table(
        "arrays",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("max_running", sa.Integer, nullable=False, server_default="0"),
        sa.Column("submitter", sa.Text, nullable=False),
        sa.Column("submitted_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "job_attempts",
        sa.Column("job_id", sa.Text, primary_key=True),
        sa.Column("attempt", sa.Integer, primary_key=True),
        sa.Column("device_ids", sa.Text, nullable=False, server_default=""),
        sa.Column("worker_id", sa.Text, nullable=False, server_default=""),
        sa.Column("started_at", sa.BigInteger, nullable=True),
        sa.Column("ended_at", sa.BigInteger, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("exit_code", sa.Integer, nullable=True),
        sa.Column("kill_reason", sa.Text, nullable=False, server_default=""),
    )


def downgrade() -> None:
    op.drop_table("job_attempts")
    op.drop_table("arrays")
    op.drop_index("jobs_array", "jobs")
    for column in reversed(_JOB_COLUMNS):
        op.drop_column("jobs", column.name)
