"""accounting: a job's measured GPU use, and the usage rollup

``jobs`` gains what the worker measured of the job's GPUs; ``usage_totals`` and
``usage_marks`` (WITHOUT ROWID: read by primary key) hold the rollup of
``store/usage.py``, filled here from the leases already released.

Revision ID: 0010_acct
Revises: 0009
"""

from __future__ import annotations

from collections import defaultdict

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"

_HOUR = 3600
#: Rows written per statement while filling the rollup.
_BATCH = 5000


def upgrade() -> None:
    for name, kind in (
        ("gpu_util_mean", sa.Float()),
        ("gpu_mem_peak_bytes", sa.BigInteger()),
        ("gpu_samples", sa.Integer()),
    ):
        op.add_column("jobs", sa.Column(name, kind, nullable=True))
    totals = op.create_table(
        "usage_totals",
        sa.Column("dim", sa.Text, primary_key=True),
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("last_hour", sa.BigInteger, nullable=False),
        sa.Column("jobs", sa.BigInteger, nullable=False),
        sa.Column("held_seconds", sa.BigInteger, nullable=False),
        sa.Column("sampled_seconds", sa.BigInteger, nullable=False),
        sa.Column("weighted_seconds", sa.Float, nullable=False),
        sa.Column("last_util", sa.Float, nullable=True),
        sqlite_with_rowid=False,
    )
    marks = op.create_table(
        "usage_marks",
        sa.Column("dim", sa.Text, primary_key=True),
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("hour", sa.BigInteger, primary_key=True),
        sa.Column("jobs", sa.BigInteger, nullable=False),
        sa.Column("held_seconds", sa.BigInteger, nullable=False),
        sa.Column("sampled_seconds", sa.BigInteger, nullable=False),
        sa.Column("weighted_seconds", sa.Float, nullable=False),
        sqlite_with_rowid=False,
    )
    op.create_index("usage_totals_recent", "usage_totals", ["dim", "last_hour"])
    _fill(op.get_bind(), totals, marks)


def _fill(conn: sa.Connection, totals: sa.Table, marks: sa.Table) -> None:
    """The rollup of every lease released so far, released order, one job at a time."""
    rows = conn.execute(
        sa.text(
            "SELECT id, job_id, device_id, holder, acquired_at, released_at FROM leases"
            " WHERE released_at IS NOT NULL ORDER BY released_at, job_id, id"
        )
    )
    # (dim, key) -> [jobs, held]; and (dim, key, hour) -> the sums at that hour's end.
    running: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    last: dict[tuple[str, str], int] = {}
    at_hour: dict[tuple[str, str, int], tuple[int, int]] = {}
    counted: set[tuple[str, str, str]] = set()
    for lease_id, job_id, device_id, holder, acquired, released in rows:
        job = job_id or f"lease:{lease_id}"
        hour = int(released) // _HOUR
        held = max(0, int(released) - int(acquired))
        host = device_id.split(":", 1)[0]
        for group in (
            ("submitter", holder),
            ("device", device_id),
            ("host", host),
            ("pair", f"{device_id} {holder}"),
        ):
            sums = running[group]
            # A several-device job counts once for its submitter and its host.
            if (group[0], group[1], job) not in counted:
                counted.add((group[0], group[1], job))
                sums[0] += 1
            sums[1] += held
            last[group] = max(hour, last.get(group, hour))
            at_hour[(group[0], group[1], last[group])] = (sums[0], sums[1])
    _insert(
        conn,
        totals,
        [
            {
                "dim": dim,
                "key": key,
                "last_hour": last[(dim, key)],
                "jobs": s[0],
                "held_seconds": s[1],
                "sampled_seconds": 0,
                "weighted_seconds": 0.0,
                "last_util": None,
            }
            for (dim, key), s in running.items()
        ],
    )
    _insert(
        conn,
        marks,
        [
            {
                "dim": dim,
                "key": key,
                "hour": hour,
                "jobs": n,
                "held_seconds": held,
                "sampled_seconds": 0,
                "weighted_seconds": 0.0,
            }
            for (dim, key, hour), (n, held) in at_hour.items()
        ],
    )


def _insert(conn: sa.Connection, table: sa.Table, rows: list[dict[str, object]]) -> None:
    for i in range(0, len(rows), _BATCH):
        conn.execute(table.insert(), rows[i : i + _BATCH])


def downgrade() -> None:
    op.drop_index("usage_totals_recent", table_name="usage_totals")
    op.drop_table("usage_marks")
    op.drop_table("usage_totals")
    # In place, not as a copied table: migration 0010's triggers name ``jobs``.
    for column in ("gpu_samples", "gpu_mem_peak_bytes", "gpu_util_mean"):
        op.execute(f"ALTER TABLE jobs DROP COLUMN {column}")
