"""devices_worker: find a worker's devices without scanning the fleet

Every heartbeat's statements read one worker's devices, not the whole fleet.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    op.create_index("devices_worker", "devices", ["worker_id"])


def downgrade() -> None:
    op.drop_index("devices_worker", table_name="devices")
