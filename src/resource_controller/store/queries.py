"""Small shared reads used by several store modules."""

from __future__ import annotations

import dataclasses
from typing import Any

import sqlalchemy as sa

from resource_controller import errors
from resource_controller.core import scheduling
from resource_controller.core.scheduling import JobSnap
from resource_controller.core.states import JobState
from resource_controller.store import fast
from resource_controller.store import schema as t
from resource_controller.store.records import DeviceRecord, JobRecord, split_ids

#: ``core.scheduling.queue_key`` as SQL (STORE-060), for reading the queue in order.
QUEUE_ORDER = (t.jobs.c.priority.desc(), t.jobs.c.queued_at.asc(), t.jobs.c.seq.asc())


def effective_priority_sql(now: int, aging: int) -> sa.ColumnElement[int]:
    """``core.scheduling.effective_priority`` as SQL (EXT-FAIR-1); the plain priority when
    aging is off. Integer division of a non-negative wait is the rule's floor."""
    j = t.jobs.c
    if aging <= 0:
        return j.priority
    waited = sa.literal(now, sa.BigInteger) - j.queued_at
    steps = sa.case((waited > 0, waited // sa.literal(aging, sa.BigInteger)), else_=0)
    top = scheduling.PRIORITY_MAX
    return sa.case(
        (j.priority >= top, j.priority),
        (j.priority + steps >= top, top),
        else_=j.priority + steps,
    )


def queue_order(now: int = 0, aging: int = 0) -> tuple[sa.UnaryExpression[Any], ...]:
    """``core.scheduling.aged_queue_key`` as SQL; ``QUEUE_ORDER`` when aging is off."""
    if aging <= 0:
        return QUEUE_ORDER
    j = t.jobs.c
    return (effective_priority_sql(now, aging).desc(), j.queued_at.asc(), j.seq.asc())


def behind(job: JobRecord | sa.Row[Any], now: int = 0, aging: int = 0) -> sa.ColumnElement[bool]:
    """Jobs after ``job`` (a record or a raw row) in ``queue_order(now, aging)``: the
    keyset for reading the queue a page at a time."""
    j = t.jobs.c
    prio = effective_priority_sql(now, aging)
    p = scheduling.effective_priority(job.priority, job.queued_at, now, aging)
    q, n = job.queued_at, job.seq
    return sa.or_(
        prio < p,
        sa.and_(prio == p, j.queued_at > q),
        sa.and_(prio == p, j.queued_at == q, j.seq > n),
    )


def job(conn: sa.Connection, job_id: str) -> JobRecord:
    """The job row with its newest lease epoch; ``JobNotFound`` when unknown (STORE-160)."""
    row = conn.execute(sa.select(t.jobs).where(t.jobs.c.id == job_id)).first()
    if row is None:
        raise errors.JobNotFound(f"no such job: {job_id}")
    epoch = conn.execute(
        sa.select(sa.func.max(t.leases.c.epoch)).where(t.leases.c.job_id == job_id)
    ).scalar()
    return JobRecord.from_row(row, lease_epoch=epoch or 0)


def with_epochs(conn: sa.Connection, records: list[JobRecord]) -> list[JobRecord]:
    """The records with each job's newest lease epoch, read in one grouped query (EXT-EPOCH-2)."""
    if not records:
        return records
    le = t.leases.c
    epochs = dict(
        conn.execute(
            sa.select(le.job_id, sa.func.max(le.epoch))
            .where(le.job_id.in_([r.id for r in records]))
            .group_by(le.job_id)
        ).all()
    )
    return [dataclasses.replace(r, lease_epoch=epochs.get(r.id) or 0) for r in records]


#: The ``jobs`` columns in ``JobRecord``'s field order (``fast.JOB_COLS``: every field
#: but the epoch, which comes from the leases), so a row builds its record positionally.
JOB_COLUMNS = tuple(t.jobs.c[name] for name in fast.JOB_COLS)
job_record = fast.job_record


def jobs_where(
    conn: sa.Connection,
    *where: sa.ColumnElement[bool],
    order: tuple[sa.UnaryExpression[Any], ...] = (),
    limit: int | None = None,
) -> list[JobRecord]:
    q = sa.select(*JOB_COLUMNS).where(*where).order_by(*order)
    if limit is not None:
        q = q.limit(limit)
    return [job_record(r) for r in conn.execute(q)]


def device(conn: sa.Connection, device_id: str) -> DeviceRecord | None:
    row = conn.execute(sa.select(t.devices).where(t.devices.c.id == device_id)).first()
    return DeviceRecord.from_row(row) if row else None


#: The ``devices`` columns in ``DeviceRecord``'s field order, so a row builds a record
#: positionally: every pass and every ``/v1/state`` reads the whole fleet, and going
#: through a mapping per row was most of that read's cost at 10,000 devices.
DEVICE_COLUMNS = tuple(t.devices.c[name] for name in fast.DEVICE_COLS)


def device_records(conn: sa.Connection, *where: sa.ColumnElement[bool]) -> list[DeviceRecord]:
    """The devices matching ``where`` (all when none), ordered by ID (API-023)."""
    q = sa.select(*DEVICE_COLUMNS).where(*where).order_by(t.devices.c.id)
    return [fast.device_record(r) for r in conn.execute(q)]


def all_devices(conn: sa.Connection) -> list[DeviceRecord]:
    return device_records(conn)


def queued_snaps(conn: sa.Connection) -> list[JobSnap]:
    """Every queued job as the scheduling rules read it (for queue positions)."""
    j = t.jobs.c
    rows = conn.execute(
        sa.select(
            j.id,
            j.seq,
            j.priority,
            j.queued_at,
            j.selector,
            j.device_id,
            j.max_runtime,
            j.device_count.label("count"),
            j.device_ids,
        ).where(j.state == JobState.QUEUED)
    ).all()
    return [JobSnap(**{**r._mapping, "device_ids": split_ids(r.device_ids or "")}) for r in rows]


def on_device(device_id: str) -> sa.ColumnElement[bool]:
    """Jobs on ``device_id``: their one device, or one of a several-device job's (EXT-GANG-1).

    Matched as a whole comma-delimited item with wildcards escaped, so ``h:g1`` never
    matches ``h:g10`` and ``_`` is never a wildcard; portable to PostgreSQL.
    """
    j = t.jobs.c
    listed = sa.literal(",").concat(j.device_ids).concat(",")
    return sa.or_(j.device_id == device_id, listed.contains(f",{device_id},", autoescape=True))


def next_counter(conn: sa.Connection, name: str) -> int:
    """Increment and return the named counter (starts at 1); inside the caller's transaction."""
    value = conn.execute(
        sa.update(t.counters)
        .where(t.counters.c.name == name)
        .values(value=t.counters.c.value + 1)
        .returning(t.counters.c.value)
    ).scalar()
    if value is None:
        conn.execute(sa.insert(t.counters).values(name=name, value=1))
        return 1
    return int(value)
