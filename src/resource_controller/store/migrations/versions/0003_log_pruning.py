"""mark jobs whose stored output the retention pass deleted

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    # The retention pass finds what is left to delete through this index, not by
    # walking every finished job on each pass.
    op.add_column(
        "jobs", sa.Column("logs_pruned", sa.Integer(), server_default="0", nullable=False)
    )
    op.create_index("jobs_log_retention", "jobs", ["logs_pruned", "finished_at"])
