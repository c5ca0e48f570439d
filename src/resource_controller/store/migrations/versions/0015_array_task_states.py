"""Array tasks by state (EXT-ARRAY-1)

A pass counts a capped array's tasks assigned or running, and an array's view counts its tasks
by state: ``jobs_array`` becomes (``array_id``, ``state``), so both read only the rows they count.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"


def _index(second: str) -> None:
    op.drop_index("jobs_array", "jobs")
    task = sa.text("array_id != ''")
    op.create_index(
        "jobs_array", "jobs", ["array_id", second], sqlite_where=task, postgresql_where=task
    )


def upgrade() -> None:
    _index("state")


def downgrade() -> None:
    _index("array_index")
