"""A fair share between people: submitter limits and job dependencies

``jobs.share_name``; ``share_held``, the devices each name holds, kept by triggers on
``leases``; ``jobs.after_ids``/``after_any``/``after_open``; ``job_after``, a row per
job and job it waits for, whose ``ended`` a trigger on ``jobs`` notes.

Revision ID: 0010_share
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"

_TERMINAL = "('succeeded', 'failed', 'killed', 'lost')"

#: The share name of a lease's job; a lease no job row backs counts under its holder.
_WHO = "coalesce((SELECT nullif(share_name, '') FROM jobs WHERE id = {row}.job_id), {row}.holder)"
_NOTE = (
    "INSERT INTO share_held (share_name, devices) VALUES ({who}, {n})"
    " ON CONFLICT (share_name) DO UPDATE SET devices = share_held.devices + excluded.devices;"
    " DELETE FROM share_held WHERE share_name = {who} AND devices <= 0;"
)
_NEW, _OLD = _WHO.format(row="NEW"), _WHO.format(row="OLD")
TRIGGERS = {
    "jobs_after_ended": (
        f"AFTER UPDATE OF state ON jobs WHEN NEW.state IN {_TERMINAL}"
        f" AND OLD.state NOT IN {_TERMINAL} BEGIN"
        " UPDATE job_after SET ended = NEW.state WHERE after_id = NEW.id AND ended = ''; END"
    ),
    "leases_held_insert": (
        "AFTER INSERT ON leases WHEN NEW.released_at IS NULL BEGIN "
        + _NOTE.format(who=_NEW, n=1)
        + " END"
    ),
    "leases_held_release": (
        "AFTER UPDATE OF released_at ON leases"
        " WHEN OLD.released_at IS NULL AND NEW.released_at IS NOT NULL BEGIN "
        + _NOTE.format(who=_OLD, n=-1)
        + " END"
    ),
    "leases_held_delete": (
        "AFTER DELETE ON leases WHEN OLD.released_at IS NULL BEGIN "
        + _NOTE.format(who=_OLD, n=-1)
        + " END"
    ),
}

PG_FUNCTIONS = (
    "CREATE FUNCTION rc_after_ended() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
    " UPDATE job_after SET ended = NEW.state WHERE after_id = NEW.id AND ended = '';"
    " RETURN NULL; END $$",
    "CREATE FUNCTION rc_held_note(who text, n bigint) RETURNS void LANGUAGE sql AS $$ "
    + _NOTE.format(who="who", n="n")
    + " $$",
    "CREATE FUNCTION rc_held() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
    " IF TG_OP = 'INSERT' THEN"
    f"  IF NEW.released_at IS NULL THEN PERFORM rc_held_note({_NEW}, 1); END IF;"
    " ELSIF TG_OP = 'UPDATE' THEN"
    "  IF OLD.released_at IS NULL AND NEW.released_at IS NOT NULL THEN"
    f"   PERFORM rc_held_note({_OLD}, -1); END IF;"
    f" ELSIF OLD.released_at IS NULL THEN PERFORM rc_held_note({_OLD}, -1);"
    " END IF; RETURN NULL; END $$",
)
PG_TRIGGERS = {
    "jobs_after_ended": (
        f"AFTER UPDATE OF state ON jobs FOR EACH ROW WHEN (NEW.state IN {_TERMINAL}"
        f" AND OLD.state NOT IN {_TERMINAL}) EXECUTE FUNCTION rc_after_ended()"
    ),
    "leases_held": (
        "AFTER INSERT OR DELETE OR UPDATE OF released_at ON leases"
        " FOR EACH ROW EXECUTE FUNCTION rc_held()"
    ),
}


def _postgres() -> bool:
    return bool(op.get_bind().dialect.name == "postgresql")


def upgrade() -> None:
    for name, kind, default in (
        ("share_name", sa.Text(), ""),
        ("after_ids", sa.Text(), ""),
        ("after_any", sa.Integer(), "0"),
        ("after_open", sa.Integer(), "0"),
    ):
        op.add_column("jobs", sa.Column(name, kind, nullable=False, server_default=default))
    op.create_table(
        "job_after",
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("after_id", sa.Text(), nullable=False),
        sa.Column("ended", sa.Text(), nullable=False, server_default=""),
        sa.PrimaryKeyConstraint("job_id", "after_id"),
    )
    op.create_index("job_after_target", "job_after", ["after_id"])
    ended = sa.text("ended != ''")
    op.create_index(
        "job_after_ended", "job_after", ["job_id"], sqlite_where=ended, postgresql_where=ended
    )
    op.create_table(
        "share_held",
        sa.Column("share_name", sa.Text(), nullable=False),
        sa.Column("devices", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("share_name"),
    )
    # Jobs that can still hold or wait for a device count under their submitter.
    op.execute(
        "UPDATE jobs SET share_name = submitter WHERE state IN ('queued', 'assigned', 'running')"
    )
    op.execute(
        "INSERT INTO share_held (share_name, devices)"
        f" SELECT {_WHO.format(row='leases')}, count(*) FROM leases"
        " WHERE released_at IS NULL GROUP BY 1"
    )
    if _postgres():
        for function in PG_FUNCTIONS:
            op.execute(function)
        for name, body in PG_TRIGGERS.items():
            op.execute(f"CREATE TRIGGER {name} {body}")
        return
    for name, body in TRIGGERS.items():
        op.execute(f"CREATE TRIGGER {name} {body}")


def downgrade() -> None:
    if _postgres():
        op.execute("DROP TRIGGER IF EXISTS jobs_after_ended ON jobs")
        op.execute("DROP TRIGGER IF EXISTS leases_held ON leases")
        op.execute("DROP FUNCTION IF EXISTS rc_held()")
        op.execute("DROP FUNCTION IF EXISTS rc_held_note(text, bigint)")
        op.execute("DROP FUNCTION IF EXISTS rc_after_ended()")
    else:
        for name in TRIGGERS:
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.drop_table("share_held")
    op.drop_index("job_after_ended", table_name="job_after")
    op.drop_index("job_after_target", table_name="job_after")
    op.drop_table("job_after")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("after_open")
        batch.drop_column("after_any")
        batch.drop_column("after_ids")
        batch.drop_column("share_name")
