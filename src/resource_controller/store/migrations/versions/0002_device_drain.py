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
    for name, kind, default in (
        ("draining", sa.Integer(), "0"),
        ("drained_by", sa.Text(), ""),
        ("drained_at", sa.BigInteger(), "0"),
        ("drain_reason", sa.Text(), ""),
    ):
        op.add_column("devices", sa.Column(name, kind, server_default=default, nullable=False))
