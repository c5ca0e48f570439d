"""device_changes: which devices changed what the scheduling pass reads of them

Triggers note for each device the ``fleet_version`` at which its row or labels last
changed, or it was removed, so the controller rereads only those (``store/fleet.py``).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"

#: Bump the counter, then note the device at its new value.
_NOTE = (
    "UPDATE counters SET value = value + 1 WHERE name = 'fleet_version'; "
    "INSERT OR REPLACE INTO device_changes (device_id, version) "
    "SELECT {who}, value FROM counters WHERE name = 'fleet_version';"
)
_SCHEDULED = "host, name, worker_id, state, max_runtime, draining"
TRIGGERS = {
    "devices_noted_insert": f"AFTER INSERT ON devices BEGIN {_NOTE.format(who='NEW.id')} END",
    "devices_noted_update": (
        f"AFTER UPDATE OF {_SCHEDULED} ON devices BEGIN {_NOTE.format(who='NEW.id')} END"
    ),
    "devices_noted_delete": f"AFTER DELETE ON devices BEGIN {_NOTE.format(who='OLD.id')} END",
    "labels_noted_insert": (
        f"AFTER INSERT ON device_labels BEGIN {_NOTE.format(who='NEW.device_id')} END"
    ),
    "labels_noted_update": (
        "AFTER UPDATE ON device_labels BEGIN "
        f"{_NOTE.format(who='OLD.device_id')} {_NOTE.format(who='NEW.device_id')} END"
    ),
    "labels_noted_delete": (
        f"AFTER DELETE ON device_labels BEGIN {_NOTE.format(who='OLD.device_id')} END"
    ),
}


#: PostgreSQL's form: one trigger function noting the row's device (its old ID too when
#: a delete, a label update or an ID change leaves it), the same counter and table.
PG_FUNCTIONS = (
    "CREATE FUNCTION rc_note_device(who text) RETURNS void LANGUAGE sql AS $$"
    " UPDATE counters SET value = value + 1 WHERE name = 'fleet_version';"
    " INSERT INTO device_changes (device_id, version)"
    " SELECT who, value FROM counters WHERE name = 'fleet_version'"
    " ON CONFLICT (device_id) DO UPDATE SET version = excluded.version; $$",
    "CREATE FUNCTION rc_noted() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
    " IF TG_TABLE_NAME = 'devices' THEN"
    "  IF TG_OP = 'DELETE' OR (TG_OP = 'UPDATE' AND OLD.id IS DISTINCT FROM NEW.id) THEN"
    "   PERFORM rc_note_device(OLD.id); END IF;"
    "  IF TG_OP <> 'DELETE' THEN PERFORM rc_note_device(NEW.id); END IF;"
    " ELSE"
    "  IF TG_OP <> 'INSERT' THEN PERFORM rc_note_device(OLD.device_id); END IF;"
    "  IF TG_OP <> 'DELETE' THEN PERFORM rc_note_device(NEW.device_id); END IF;"
    " END IF; RETURN NULL; END $$",
)
PG_TRIGGERS = {
    "devices_noted": "AFTER INSERT OR DELETE ON devices",
    "devices_noted_update": f"AFTER UPDATE OF {_SCHEDULED} ON devices",
    "labels_noted": "AFTER INSERT OR UPDATE OR DELETE ON device_labels",
}


def _postgres() -> bool:
    return bool(op.get_bind().dialect.name == "postgresql")


def upgrade() -> None:
    op.create_table(
        "device_changes",
        sa.Column("device_id", sa.Text(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("device_id"),
    )
    op.create_index("device_changes_version", "device_changes", ["version"])
    op.execute(
        "INSERT INTO counters (name, value) VALUES ('fleet_version', 0)"
        " ON CONFLICT (name) DO NOTHING"
    )
    if _postgres():
        for function in PG_FUNCTIONS:
            op.execute(function)
        for name, when in PG_TRIGGERS.items():
            op.execute(f"CREATE TRIGGER {name} {when} FOR EACH ROW EXECUTE FUNCTION rc_noted()")
        return
    for name, body in TRIGGERS.items():
        op.execute(f"CREATE TRIGGER {name} {body}")


def downgrade() -> None:
    if _postgres():
        for name, when in PG_TRIGGERS.items():
            op.execute(f"DROP TRIGGER IF EXISTS {name} ON {when.split(' ON ')[-1]}")
        op.execute("DROP FUNCTION IF EXISTS rc_noted()")
        op.execute("DROP FUNCTION IF EXISTS rc_note_device(text)")
    else:
        for name in TRIGGERS:
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.drop_index("device_changes_version", table_name="device_changes")
    op.drop_table("device_changes")
    op.execute("DELETE FROM counters WHERE name = 'fleet_version'")
