"""device_changes: every device column but the heartbeat stamp, and only real changes

The fleet views read every column, so a change of any but ``last_heartbeat_at`` (which
they read alone) is noted, and only when a value differs.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"

#: Bump the counter, then note the device at its new value (as in 0006).
_NOTE = (
    "UPDATE counters SET value = value + 1 WHERE name = 'fleet_version'; "
    "INSERT OR REPLACE INTO device_changes (device_id, version) "
    "SELECT NEW.id, value FROM counters WHERE name = 'fleet_version';"
)
#: Every ``devices`` column but ``last_heartbeat_at`` (``tests/store/test_fleet_snapshot.py``
#: holds this to the schema).
NOTED = (
    "id",
    "host",
    "name",
    "worker_id",
    "state",
    "max_runtime",
    "quarantine_reason",
    "quarantine_detail",
    "draining",
    "drained_by",
    "drained_at",
    "drain_reason",
)
_CHANGED = " OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in NOTED)
_OLD_SCHEDULED = "host, name, worker_id, state, max_runtime, draining"


_PG_CHANGED = " OR ".join(f"OLD.{c} IS DISTINCT FROM NEW.{c}" for c in NOTED)


def _postgres() -> bool:
    return bool(op.get_bind().dialect.name == "postgresql")


def upgrade() -> None:
    if _postgres():
        # One trigger: rc_noted (0006) notes the old ID of a renamed device itself.
        op.execute("DROP TRIGGER devices_noted_update ON devices")
        op.execute(
            "CREATE TRIGGER devices_noted_update AFTER UPDATE ON devices FOR EACH ROW"
            f" WHEN ({_PG_CHANGED}) EXECUTE FUNCTION rc_noted()"
        )
        return
    op.execute("DROP TRIGGER devices_noted_update")
    op.execute(
        f"CREATE TRIGGER devices_noted_update AFTER UPDATE ON devices WHEN {_CHANGED} "
        f"BEGIN {_NOTE} END"
    )
    # A renamed device (an ID change, which no writer makes) is noted at its old ID too.
    op.execute(
        "CREATE TRIGGER devices_noted_rename AFTER UPDATE OF id ON devices "
        "WHEN OLD.id IS NOT NEW.id BEGIN " + _NOTE.replace("NEW.id", "OLD.id") + " END"
    )


def downgrade() -> None:
    if _postgres():
        op.execute("DROP TRIGGER devices_noted_update ON devices")
        op.execute(
            f"CREATE TRIGGER devices_noted_update AFTER UPDATE OF {_OLD_SCHEDULED} ON devices"
            " FOR EACH ROW EXECUTE FUNCTION rc_noted()"
        )
        return
    op.execute("DROP TRIGGER devices_noted_rename")
    op.execute("DROP TRIGGER devices_noted_update")
    op.execute(
        f"CREATE TRIGGER devices_noted_update AFTER UPDATE OF {_OLD_SCHEDULED} ON devices "
        f"BEGIN {_NOTE} END"
    )
