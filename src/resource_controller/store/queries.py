"""The store's shared reads and small writes as SQL text, the same on both databases; a row builds
its record by ``_make`` in column order."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from resource_controller import errors
from resource_controller.core import scheduling
from resource_controller.core.scheduling import JobSnap
from resource_controller.core.states import JobState
from resource_controller.store import sql
from resource_controller.store.records import DeviceRecord, JobRecord, split_ids
from resource_controller.store.usage import Held

#: ``JobRecord``'s fields but the epoch (the last); ``job_record`` builds a record with or without
#: it.
JOB_COLS: tuple[str, ...] = JobRecord._fields[:-1]

_JOB_LIST = ", ".join(f"jobs.{c}" for c in JOB_COLS)
#: Every column of a job and its newest lease epoch: a whole ``JobRecord``.
JOB_WITH_EPOCH = (
    f"SELECT {_JOB_LIST}, (SELECT max(epoch) FROM leases WHERE leases.job_id = jobs.id) FROM jobs"
)
_JOB_BY_ID = JOB_WITH_EPOCH + " WHERE jobs.id = ?"
_DEVICES = f"SELECT {', '.join(DeviceRecord._fields)} FROM devices"
#: The device of the ``devices`` row at hand holds a live lease.
LEASED = (
    "EXISTS (SELECT 1 FROM leases WHERE leases.device_id = devices.id"
    " AND leases.released_at IS NULL)"
)
#: A job pinned to one device and nothing more: the pass only claims its device or places it.
PLAIN_PIN = (
    "(jobs.device_id != '' AND jobs.selector = '' AND jobs.device_ids = ''"
    " AND jobs.device_count <= 1)"
)
#: The name a job's submitter limit counts it under (old rows have no ``share_name``).
SHARE = "(CASE WHEN jobs.share_name = '' THEN jobs.submitter ELSE jobs.share_name END)"


class QueueRow(NamedTuple):
    """What the pass reads of a queued job: the rules' columns only (each costs ~0.1 µs a row)."""

    id: str
    device_id: str
    #: Pinned to one device and nothing more (``PLAIN_PIN``).
    plain_pin: int
    #: The name its submitter limit counts it under (``SHARE``).
    share: str
    seq: int
    priority: int
    queued_at: int
    selector: str
    max_runtime_seconds: int
    device_count: int
    device_ids: str
    avoid_device_ids: str
    preemptible: int
    array_id: str


class QueueEntry(NamedTuple):
    """The first ``WALK_WIDTH`` columns of a ``QueueRow``: a narrow page's rows."""

    id: str
    device_id: str
    plain_pin: int
    share: str


WALK_WIDTH = len(QueueEntry._fields)
_COMPUTED = {"plain_pin": PLAIN_PIN, "share": SHARE}
QUEUE_COLS: tuple[str, ...] = tuple(_COMPUTED.get(c, "jobs." + c) for c in QueueRow._fields)
_QUEUE_SCHED = "SELECT " + ", ".join(QUEUE_COLS)
_QUEUE_WALK = "SELECT " + ", ".join(QUEUE_COLS[:WALK_WIDTH])
queue_row = QueueRow._make

_I_COMMAND = JOB_COLS.index("command")
_I_ENV = JOB_COLS.index("env")
_I_DEVICE_IDS = JOB_COLS.index("device_ids")
_I_AFTER_IDS = JOB_COLS.index("after_ids")
_I_AVOID = JOB_COLS.index("avoid_device_ids")
_N_JOB_COLS = len(JOB_COLS)


def id_in(n: int) -> str:
    """``id IN (?, ...)`` for ``n`` parameters."""
    return "id IN (" + ", ".join("?" * n) + ")"


def job_record(row: Sequence[Any]) -> JobRecord:
    """A ``jobs`` row in ``JOB_COLS`` order (with its epoch or without) as a decoded record."""
    values = list(row)
    if len(values) == _N_JOB_COLS:
        values.append(0)
    values[_I_COMMAND] = json.loads(values[_I_COMMAND])
    env = values[_I_ENV]
    values[_I_ENV] = json.loads(env) if env and env != "{}" else {}
    values[_I_DEVICE_IDS] = split_ids(values[_I_DEVICE_IDS] or "")
    values[_I_AFTER_IDS] = split_ids(values[_I_AFTER_IDS] or "")
    values[_I_AVOID] = split_ids(values[_I_AVOID] or "")
    values[-1] = values[-1] or 0
    return JobRecord._make(values)


def job(conn: sql.Db, job_id: str) -> JobRecord:
    """The job with its newest lease epoch, in one statement; ``JobNotFound`` when unknown."""
    row = conn.one(_JOB_BY_ID, (job_id,))
    if row is None:
        raise errors.JobNotFound(f"no such job: {job_id}")
    return job_record(row)


def device(conn: sql.Db, device_id: str, *, lock: bool = False) -> DeviceRecord | None:
    """The device, its row locked for the transaction with ``lock`` (PostgreSQL): what
    the caller decides from it then cannot change under it (``lock_worker_devices``)."""
    text = _DEVICES + " WHERE id = ?" + (" FOR UPDATE" if lock and conn.postgres else "")
    row = conn.one(text, (device_id,))
    return DeviceRecord._make(row) if row else None


def all_devices(conn: sql.Db) -> list[DeviceRecord]:
    return list(map(DeviceRecord._make, conn.execute(_DEVICES + " ORDER BY id")))


def devices_by_id(conn: sql.Db, ids: Sequence[str]) -> list[DeviceRecord]:
    """The devices among ``ids`` that exist, by ID."""
    text = f"{_DEVICES} WHERE {id_in(len(ids))} ORDER BY id"
    return list(map(DeviceRecord._make, conn.execute(text, tuple(ids))))


def update_reservations(
    conn: sql.Db, now: int, gone: Sequence[str], rows: Sequence[tuple[str, str]] = ()
) -> None:
    """Delete the ``gone`` devices' reservations and write ``rows``, in few statements."""
    for at in range(0, len(gone), _ROWS_A_STATEMENT):
        devices = gone[at : at + _ROWS_A_STATEMENT]
        conn.execute(
            f"DELETE FROM reservations WHERE device_id IN ({sql.marks(len(devices))})", devices
        )
    for at in range(0, len(rows), _ROWS_A_STATEMENT):
        part = rows[at : at + _ROWS_A_STATEMENT]
        values = ", ".join(["(?, ?, ?)"] * len(part))
        conn.execute(
            f"INSERT INTO reservations (job_id, device_id, created_at) VALUES {values}"
            " ON CONFLICT (device_id) DO UPDATE SET job_id = excluded.job_id,"
            " created_at = excluded.created_at",
            [v for job_id, device_id in part for v in (job_id, device_id, now)],
        )


#: Rows of one reservation statement: well under SQLite's 32,766 parameters.
_ROWS_A_STATEMENT = 1000


def queue_page(
    conn: sql.Db,
    after: tuple[int, int, int] | None,
    limit: int,
    narrow: bool = False,
    now: int = 0,
    aging: int = 0,
    skip: Sequence[str] = (),
    skip_arrays: Sequence[str] = (),
) -> Sequence[QueueRow | QueueEntry]:
    """Up to ``limit`` eligible queued rows behind ``after``, leaving out names in ``skip`` and
    the tasks of the arrays in ``skip_arrays``."""
    text = (_QUEUE_WALK if narrow else _QUEUE_SCHED) + " FROM jobs WHERE jobs.state = ?"
    text += " AND jobs.after_open = 0"
    params: tuple[Any, ...] = (str(JobState.QUEUED),)
    if skip:
        text += f" AND {SHARE} NOT IN ({sql.marks(len(skip))})"
        params += tuple(skip)
    if skip_arrays:
        text += f" AND jobs.array_id NOT IN ({sql.marks(len(skip_arrays))})"
        params += tuple(skip_arrays)
    if after is not None:
        cond, args = behind(*after, now, aging)
        text += " AND " + cond
        params += args
    text += f" ORDER BY {queue_order(now, aging)} LIMIT ?"
    rows = conn.all(text, (*params, limit))
    return list(map(QueueEntry._make if narrow else queue_row, rows))


def queue_rows(conn: sql.Db, job_ids: Sequence[str]) -> list[QueueRow]:
    """The ``QueueRow``s of the jobs among ``job_ids`` (in no order)."""
    text = f"{_QUEUE_SCHED} FROM jobs WHERE jobs.{id_in(len(job_ids))}"
    return list(map(queue_row, conn.all(text, tuple(job_ids))))


def pinned_elsewhere(conn: sql.Db, known: Sequence[str], now: int = 0, aging: int = 0) -> list[Any]:
    """Queued eligible jobs pinned to a device not in ``known``, in queue order."""
    text = f"SELECT {_JOB_LIST} FROM jobs WHERE jobs.state = ?"
    text += " AND jobs.device_id != '' AND jobs.after_open = 0"
    if known:
        text += f" AND jobs.device_id NOT IN ({sql.marks(len(known))})"
    text += f" ORDER BY {queue_order(now, aging)}"
    return conn.execute(text, (str(JobState.QUEUED), *known)).fetchall()


#: The counter of ``jobs.seq``, seeded from the jobs there the first time.
SEQ_START = "(SELECT coalesce(max(seq), 0) + 1 FROM jobs)"


def next_counter(conn: sql.Db, name: str, start: str = "1", n: int = 1) -> int:
    """Take the named counter's next ``n`` numbers in one statement (no number is taken twice);
    the first of them."""
    text = (
        f"INSERT INTO counters (name, value) VALUES (?, {start} + ?)"
        " ON CONFLICT (name) DO UPDATE SET value = counters.value + ? RETURNING value"
    )
    return int(conn.value(text, (name, n - 1, n))) - n + 1


def lock_worker_devices(conn: sql.Db, worker_id: str) -> None:
    """Lock a worker's devices' rows in ID order (PostgreSQL): under READ COMMITTED a grant
    committing between a read and a write would be undone by the write."""
    if conn.postgres:
        conn.execute(
            "SELECT id FROM devices WHERE worker_id = ? ORDER BY id FOR UPDATE", (worker_id,)
        )


def live_lease_devices(conn: sql.Db, job_id: str) -> list[str]:
    """The devices of ``job_id``'s live leases, their rows locked on PostgreSQL."""
    lock = " FOR UPDATE" if conn.postgres else ""
    rows = conn.all(
        "SELECT device_id FROM leases WHERE job_id = ? AND released_at IS NULL" + lock, (job_id,)
    )
    return sorted(str(device_id) for (device_id,) in rows)


def release_leases(conn: sql.Db, now: int, job_id: str, by: str = "job_id") -> list[Held]:
    """Release ``job_id``'s live leases (``by="id"``: the lease of that ID): what each held."""
    rows = conn.all(
        f"UPDATE leases SET released_at = ? WHERE {by} = ? AND released_at IS NULL"
        " RETURNING device_id, holder, job_id, acquired_at",
        (now, job_id),
    )
    return sorted(Held(str(d), str(h), str(j), now - int(a)) for d, h, j, a in rows)


#: ``core.scheduling.queue_key`` as SQL, for reading the queue in order.
QUEUE_ORDER = "jobs.priority DESC, jobs.queued_at ASC, jobs.seq ASC"


def effective_priority_sql(now: int, aging: int) -> str:
    """``core.scheduling.effective_priority`` as SQL (a test holds the two together); ``now`` and
    ``aging`` are our integers, written into the text."""
    if aging <= 0:
        return "jobs.priority"
    now, aging, top = int(now), int(aging), int(scheduling.PRIORITY_MAX)
    steps = (
        f"(CASE WHEN {now} - jobs.queued_at > 0 THEN ({now} - jobs.queued_at) / {aging} ELSE 0 END)"
    )
    return (
        f"(CASE WHEN jobs.priority >= {top} THEN jobs.priority"
        f" WHEN jobs.priority + {steps} >= {top} THEN {top}"
        f" ELSE jobs.priority + {steps} END)"
    )


def queue_order(now: int = 0, aging: int = 0) -> str:
    """``core.scheduling.aged_queue_key`` as an ORDER BY list; ``QUEUE_ORDER`` when aging is off."""
    if aging <= 0:
        return QUEUE_ORDER
    return f"{effective_priority_sql(now, aging)} DESC, jobs.queued_at ASC, jobs.seq ASC"


def behind(
    priority: int, queued_at: int, seq: int, now: int = 0, aging: int = 0, ahead: bool = False
) -> tuple[str, tuple[Any, ...]]:
    """Jobs after this key in queue order (``ahead``: before it), as a condition and params."""
    prio = effective_priority_sql(now, aging)
    p = scheduling.effective_priority(priority, queued_at, now, aging)
    first, then = (">", "<") if ahead else ("<", ">")
    text = (
        f"({prio} {first} ? OR ({prio} = ? AND jobs.queued_at {then} ?)"
        f" OR ({prio} = ? AND jobs.queued_at = ? AND jobs.seq {then} ?))"
    )
    return text, (p, p, queued_at, p, queued_at, seq)


def jobs_where(
    conn: sql.Db,
    where: str = "",
    params: Sequence[Any] = (),
    order: str = "",
    limit: int | None = None,
    epochs: bool = False,
) -> list[JobRecord]:
    """The jobs matching ``where``, with their lease epochs or without (0)."""
    text = JOB_WITH_EPOCH if epochs else f"SELECT {_JOB_LIST} FROM jobs"
    if where:
        text += f" WHERE {where}"
    if order:
        text += f" ORDER BY {order}"
    args = tuple(params)
    if limit is not None:
        text += " LIMIT ?"
        args += (limit,)
    return [job_record(r) for r in conn.execute(text, args)]


def snap(row: QueueRow, after_open: int = 0) -> JobSnap:
    """What the rules read of a job, from its ``QueueRow`` (as ``JobRecord.snap`` would
    from the whole row, which is read only when the job is placed)."""
    return JobSnap(
        row.id,
        row.seq,
        row.priority,
        row.queued_at,
        row.selector,
        row.device_id,
        row.max_runtime_seconds,
        max(1, row.device_count),
        split_ids(row.device_ids),
        row.share,
        after_open,
        split_ids(row.avoid_device_ids),
        bool(row.preemptible),
        row.array_id,
    )


def reserving_snaps(conn: sql.Db) -> list[JobSnap]:
    """The queued jobs that hold a reservation of the last pass, as the rules read them."""
    text = f"{_QUEUE_SCHED}, jobs.after_open FROM jobs WHERE jobs.state = ?"
    text += " AND jobs.id IN (SELECT job_id FROM reservations)"
    rows = conn.all(text, (str(JobState.QUEUED),))
    return [snap(queue_row(r[:-1]), r[-1]) for r in rows]


def on_device(device_id: str) -> tuple[str, tuple[Any, ...]]:
    """Jobs on ``device_id``, matched as a whole list item, so ``h:g1`` never matches ``h:g10``."""
    item = f",{device_id},"
    return (
        "(jobs.device_id = ? OR (jobs.device_ids != ''"
        " AND strpos(',' || jobs.device_ids || ',', ?) > 0))",
        (device_id, item),
    )
