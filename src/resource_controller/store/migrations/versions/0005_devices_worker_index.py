"""devices_worker: find a worker's devices without scanning the fleet

Every heartbeat updates and conditionally moves the devices of one worker; without an
index each of those statements read every device row (10,000 rows per heartbeat on a
fleet of 10,000 devices).

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
