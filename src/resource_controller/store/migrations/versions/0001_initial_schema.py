"""initial schema

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "counters",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "device_labels",
        sa.Column("device_id", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("device_id", "key", "source"),
    )
    op.create_index("device_labels_device", "device_labels", ["device_id"])
    op.create_table(
        "device_recoveries",
        sa.Column("device_id", sa.Text(), nullable=False),
        sa.Column("at", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
    )
    op.create_index("device_recoveries_device_at", "device_recoveries", ["device_id", "at"])
    op.create_table(
        "devices",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("worker_id", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("last_heartbeat_at", sa.BigInteger(), nullable=False),
        sa.Column("max_runtime", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("quarantine_reason", sa.Text(), server_default="", nullable=False),
        sa.Column("quarantine_detail", sa.Text(), server_default="", nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "host_docs",
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("device_id", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("host", "device_id"),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("selector", sa.Text(), server_default="", nullable=False),
        sa.Column("command", sa.Text(), nullable=False),
        sa.Column("cwd", sa.Text(), server_default="", nullable=False),
        sa.Column("env", sa.Text(), nullable=True),
        sa.Column("submitter", sa.Text(), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("device_id", sa.Text(), server_default="", nullable=False),
        sa.Column("worker_id", sa.Text(), server_default="", nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("kill_reason", sa.Text(), server_default="", nullable=False),
        sa.Column("submitted_at", sa.BigInteger(), nullable=False),
        sa.Column("started_at", sa.BigInteger(), nullable=True),
        sa.Column("finished_at", sa.BigInteger(), nullable=True),
        sa.Column("priority", sa.Integer(), server_default="0", nullable=False),
        sa.Column("max_runtime", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("idle_timeout", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("queued_at", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("kill_requested", sa.Integer(), server_default="0", nullable=False),
        sa.Column("kill_delivered_at", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("kind", sa.Text(), server_default="job", nullable=False),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.Column("stdio", sa.Text(), server_default="", nullable=False),
        sa.Column("device_count", sa.Integer(), server_default="1", nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("seq"),
    )
    op.create_index("jobs_device", "jobs", ["device_id", "submitted_at"])
    op.create_index(
        "jobs_idempotency",
        "jobs",
        ["idempotency_key"],
        unique=True,
        sqlite_where=sa.text("idempotency_key IS NOT NULL"),
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )
    op.create_index(
        "jobs_queue", "jobs", ["state", sa.literal_column("priority DESC"), "queued_at"]
    )
    op.create_index("jobs_worker_state", "jobs", ["worker_id", "state"])
    op.create_table(
        "leases",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("device_id", sa.Text(), nullable=False),
        sa.Column("holder", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Text(), server_default="", nullable=False),
        sa.Column("acquired_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.Column("released_at", sa.BigInteger(), nullable=True),
        sa.Column("kind", sa.Text(), server_default="job", nullable=False),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.Column("epoch", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("leases_job", "leases", ["job_id"])
    op.create_index(
        "leases_one_live_per_device",
        "leases",
        ["device_id"],
        unique=True,
        sqlite_where=sa.text("released_at IS NULL"),
        postgresql_where=sa.text("released_at IS NULL"),
    )
    op.create_table(
        "reservations",
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("device_id", sa.Text(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "device_id"),
    )
    op.create_index("reservations_device", "reservations", ["device_id"], unique=True)
    op.create_table(
        "workers",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("boot_id", sa.Text(), server_default="", nullable=False),
        sa.Column("last_heartbeat_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
