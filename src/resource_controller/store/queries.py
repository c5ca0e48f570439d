"""The store's shared reads and small writes, as SQL text on ``sql.Db``.

Column lists are named by the records' fields in their order, so a row builds its
record by ``_make`` (the store tests hold every table column to a field). Every
statement here runs on SQLite and PostgreSQL alike: ``?`` placeholders (``Db`` rewrites
them for psycopg), no dialect-only functions, integers for flags.
"""

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

#: ``JobRecord``'s fields but the epoch (the last), in its order: a row of them, with or
#: without the epoch after them, builds a record (``job_record``).
JOB_COLS: tuple[str, ...] = JobRecord._fields[:-1]
#: In ``DeviceRecord``'s field order, so a row builds a record positionally (a third of
#: the cost of a mapping, and ``/v1/state`` builds one per device).
DEVICE_COLS: tuple[str, ...] = DeviceRecord._fields

_JOB_LIST = ", ".join(f"jobs.{c}" for c in JOB_COLS)
#: Every column of a job and its newest lease epoch: a whole ``JobRecord``.
JOB_WITH_EPOCH = (
    f"SELECT {_JOB_LIST}, (SELECT max(epoch) FROM leases WHERE leases.job_id = jobs.id) FROM jobs"
)
_JOB_BY_ID = JOB_WITH_EPOCH + " WHERE jobs.id = ?"
_DEVICES = f"SELECT {', '.join(DEVICE_COLS)} FROM devices"
_DEVICE_BY_ID = _DEVICES + " WHERE id = ?"
_ALL_DEVICES = _DEVICES + " ORDER BY id"
_QUEUE = f"SELECT {_JOB_LIST} FROM jobs WHERE jobs.state = ?"
#: The device of the ``devices`` row at hand holds a live lease.
LEASED = (
    "EXISTS (SELECT 1 FROM leases WHERE leases.device_id = devices.id"
    " AND leases.released_at IS NULL)"
)
#: A queued job that waits for no other job: the only kind a pass places.
ELIGIBLE = "jobs.after_open = 0"
#: A job pinned to one device and nothing more (no selector, no list, one device): all
#: the pass does with one is claim its device or place it there.
PLAIN_PIN = (
    "(jobs.device_id != '' AND jobs.selector = '' AND jobs.device_ids = ''"
    " AND jobs.device_count <= 1)"
)
#: The name a job's submitter limit counts it under: its ``share_name``,
#: else (a row written before it had one) its submitter.
SHARE = "(CASE WHEN jobs.share_name = '' THEN jobs.submitter ELSE jobs.share_name END)"


class QueueRow(NamedTuple):
    """What the scheduling pass reads of each queued job: the rules' columns only (the
    whole row, whose command and environment are most of its bytes, is read by ID on
    placement). Its first ``WALK_WIDTH`` (``QueueEntry``, ``core.passloop``'s entry) are
    all a long pinned queue needs of a row; every column read costs about as much as
    any other (~0.1 µs a row, most of a walk over 10,000 pinned jobs)."""

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
queue_entry = QueueEntry._make

_I_COMMAND = JOB_COLS.index("command")
_I_ENV = JOB_COLS.index("env")
_I_DEVICE_IDS = JOB_COLS.index("device_ids")
_I_AFTER_IDS = JOB_COLS.index("after_ids")
_N_JOB_COLS = len(JOB_COLS)


def id_in(n: int) -> str:
    """``id IN (?, ...)`` for ``n`` parameters."""
    return "id IN (" + ", ".join("?" * n) + ")"


def job_record(row: Sequence[Any]) -> JobRecord:
    """A ``jobs`` row read in ``JOB_COLS`` order, with its lease epoch after them or
    without (0), as a record: the JSON and list columns decoded."""
    values = list(row)
    if len(values) == _N_JOB_COLS:
        values.append(0)
    values[_I_COMMAND] = json.loads(values[_I_COMMAND])
    env = values[_I_ENV]
    values[_I_ENV] = json.loads(env) if env and env != "{}" else {}
    values[_I_DEVICE_IDS] = split_ids(values[_I_DEVICE_IDS] or "")
    values[_I_AFTER_IDS] = split_ids(values[_I_AFTER_IDS] or "")
    values[-1] = values[-1] or 0
    return _job(values)


def job(conn: sql.Db, job_id: str) -> JobRecord:
    """The job with its newest lease epoch, in one statement; ``JobNotFound`` when unknown."""
    row = conn.one(_JOB_BY_ID, (job_id,))
    if row is None:
        raise errors.JobNotFound(f"no such job: {job_id}")
    return job_record(row)


device_record = DeviceRecord._make
_job = JobRecord._make


def device(conn: sql.Db, device_id: str, *, lock: bool = False) -> DeviceRecord | None:
    """The device, its row locked for the transaction with ``lock`` (PostgreSQL): what
    the caller decides from it then cannot change under it (``lock_worker_devices``)."""
    text = _DEVICE_BY_ID + (" FOR UPDATE" if lock and conn.postgres else "")
    row = conn.execute(text, (device_id,)).fetchone()
    return device_record(row) if row else None


def all_devices(conn: sql.Db) -> list[DeviceRecord]:
    return [device_record(r) for r in conn.execute(_ALL_DEVICES)]


def devices_by_id(conn: sql.Db, ids: Sequence[str]) -> list[DeviceRecord]:
    """The devices among ``ids`` that exist, by ID."""
    sql = f"{_DEVICES} WHERE {id_in(len(ids))} ORDER BY id"
    return [device_record(r) for r in conn.execute(sql, tuple(ids))]


def any_queued(conn: sql.Db) -> bool:
    """Some job is queued: one probe of the ``jobs_queue`` index, however long the history."""
    row = conn.one("SELECT 1 FROM jobs WHERE state = ? LIMIT 1", (str(JobState.QUEUED),))
    return row is not None


def update_reservations(
    conn: sql.Db, now: int, gone: Sequence[str], rows: Sequence[tuple[str, str]]
) -> None:
    """Bring the reservation rows to a pass's plan in at most a few statements: the rows
    of the ``gone`` devices deleted, ``rows`` (job, device) written over their device's
    row or added. A pass changes a few rows of many, and each statement is a round trip
    to a database server: rewriting them all cost a statement a row."""
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


#: Rows of one reservation statement: three parameters each stay well under SQLite's
#: limit of 32,766 a statement.
_ROWS_A_STATEMENT = 1000


def delete_reservations_of_devices(conn: sql.Db, device_ids: Sequence[str]) -> None:
    text = f"DELETE FROM reservations WHERE device_id IN ({sql.marks(len(device_ids))})"
    conn.execute(text, tuple(device_ids))


def queue_page(
    conn: sql.Db,
    after: tuple[int, int, int] | None,
    limit: int,
    narrow: bool = False,
    now: int = 0,
    aging: int = 0,
    skip: Sequence[str] = (),
) -> Sequence[QueueRow | QueueEntry]:
    """Up to ``limit`` queued rows behind ``after`` in ``queue_order(now, aging)``, each a
    ``QueueRow`` (``narrow``: a ``QueueEntry``); ``after`` is the
    (priority, queued_at, seq) of the last row read. Jobs still waiting for others to
    end are not eligible and are left out, as are the jobs counted under a
    name in ``skip`` (names at their limit)."""
    text = (_QUEUE_WALK if narrow else _QUEUE_SCHED) + " FROM jobs WHERE jobs.state = ?"
    text += " AND " + ELIGIBLE
    params: tuple[Any, ...] = (str(JobState.QUEUED),)
    if skip:
        text += f" AND {SHARE} NOT IN ({sql.marks(len(skip))})"
        params += tuple(skip)
    if after is not None:
        cond, args = behind(*after, now, aging)
        text += " AND " + cond
        params += args
    text += f" ORDER BY {queue_order(now, aging)} LIMIT ?"
    rows = conn.all(text, (*params, limit))
    return list(map(queue_entry, rows)) if narrow else list(map(queue_row, rows))


def queue_rows(conn: sql.Db, job_ids: Sequence[str]) -> list[QueueRow]:
    """The ``QueueRow``s of the jobs among ``job_ids`` (in no order)."""
    text = f"{_QUEUE_SCHED} FROM jobs WHERE jobs.{id_in(len(job_ids))}"
    return list(map(queue_row, conn.all(text, tuple(job_ids))))


def queue_key_of(conn: sql.Db, job_id: str) -> tuple[int, int, int] | None:
    """The job's (priority, queued_at, seq): where it stands in the queue's order."""
    row = conn.one("SELECT priority, queued_at, seq FROM jobs WHERE id = ?", (job_id,))
    if row is None:
        return None
    priority, queued_at, seq = row
    return priority, queued_at, seq


def pinned_elsewhere(conn: sql.Db, known: Sequence[str], now: int = 0, aging: int = 0) -> list[Any]:
    """Raw queued rows of eligible jobs pinned to a device not in ``known`` (one with no
    row), in ``queue_order(now, aging)``."""
    text = _QUEUE + " AND jobs.device_id != '' AND " + ELIGIBLE
    if known:
        text += f" AND jobs.device_id NOT IN ({sql.marks(len(known))})"
    text += f" ORDER BY {queue_order(now, aging)}"
    return conn.execute(text, (str(JobState.QUEUED), *known)).fetchall()


#: The counter of ``jobs.seq``, seeded from the jobs there the first time.
SEQ_COUNTER = "job_seq"
_NEXT_SEQ = (
    "INSERT INTO counters (name, value) VALUES (?, (SELECT coalesce(max(seq), 0) + 1 FROM jobs))"
    " ON CONFLICT (name) DO UPDATE SET value = counters.value + 1 RETURNING value"
)
_NEXT_COUNTER = (
    "INSERT INTO counters (name, value) VALUES (?, 1)"
    " ON CONFLICT (name) DO UPDATE SET value = counters.value + 1 RETURNING value"
)


def next_seq(conn: sql.Db) -> int:
    """The next job's place in submission order. A counter row, not ``max(seq) + 1``:
    its lock orders submits that several controllers make at once."""
    return int(conn.value(_NEXT_SEQ, (SEQ_COUNTER,)))


def next_counter(conn: sql.Db, name: str) -> int:
    """Increment and return the named counter (starts at 1); inside the caller's
    transaction, in one statement, so two controllers never take one number."""
    return int(conn.value(_NEXT_COUNTER, (name,)))


def lock_worker_devices(conn: sql.Db, worker_id: str) -> None:
    """Lock the rows of a worker's devices, in ID order as grants take them, for the
    rest of the transaction (PostgreSQL; SQLite has one writer at a time). A
    transaction that reads the worker's jobs and leases and then moves its devices
    takes this first: under READ COMMITTED a grant committing between its read and its
    write would otherwise be undone by the write (a busy device made ready)."""
    if conn.postgres:
        conn.execute(
            "SELECT id FROM devices WHERE worker_id = ? ORDER BY id FOR UPDATE", (worker_id,)
        )


def live_lease_devices(conn: sql.Db, job_id: str) -> list[str]:
    """The devices of the live leases of ``job_id``, their rows locked for this
    transaction on PostgreSQL (SQLite has one writer at a time)."""
    lock = " FOR UPDATE" if conn.postgres else ""
    rows = conn.all(
        "SELECT device_id FROM leases WHERE job_id = ? AND released_at IS NULL" + lock, (job_id,)
    )
    return sorted(str(device_id) for (device_id,) in rows)


def release_leases(conn: sql.Db, now: int, job_id: str) -> list[Held]:
    """Release the live leases of ``job_id``: what each held, by device."""
    rows = conn.execute(
        "UPDATE leases SET released_at = ? WHERE job_id = ? AND released_at IS NULL"
        " RETURNING device_id, holder, acquired_at",
        (now, job_id),
    ).fetchall()
    return sorted(Held(str(d), str(h), job_id, now - int(a)) for d, h, a in rows)


def release_lease(conn: sql.Db, now: int, lease_id: str) -> list[Held]:
    """Release one live lease by its own ID; what it held, or [] when it was not live."""
    rows = conn.execute(
        "UPDATE leases SET released_at = ? WHERE id = ? AND released_at IS NULL"
        " RETURNING device_id, holder, job_id, acquired_at",
        (now, lease_id),
    ).fetchall()
    return [Held(str(d), str(h), str(j), now - int(a)) for d, h, j, a in rows]


#: ``core.scheduling.queue_key`` as SQL, for reading the queue in order.
QUEUE_ORDER = "jobs.priority DESC, jobs.queued_at ASC, jobs.seq ASC"


def effective_priority_sql(now: int, aging: int) -> str:
    """``core.scheduling.effective_priority`` as SQL; the plain priority when
    aging is off. Integer division of a non-negative wait is the rule's floor. ``now`` and
    ``aging`` are integers of ours, so they are written into the text."""
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
    """Jobs after the one with this key in ``queue_order(now, aging)`` (``ahead``: before
    it), as a condition and its parameters: the keyset for reading the queue a page at a
    time, and a queue position's count."""
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
) -> list[JobRecord]:
    """The jobs matching ``where`` (SQL text, ``?`` for ``params``), without their epochs."""
    text = f"SELECT {_JOB_LIST} FROM jobs"
    if where:
        text += f" WHERE {where}"
    if order:
        text += f" ORDER BY {order}"
    args = tuple(params)
    if limit is not None:
        text += " LIMIT ?"
        args += (limit,)
    return [job_record(r) for r in conn.execute(text, args)]


_QUEUED_SNAPS = (
    "SELECT id, seq, priority, queued_at, selector, device_id, max_runtime_seconds, device_count,"
    f" device_ids, {SHARE}, after_open FROM jobs WHERE state = ?"
)


def queued_snaps(conn: sql.Db, reserving: bool = False) -> list[JobSnap]:
    """Every queued job as the scheduling rules read it; ``reserving``: only those that
    hold a reservation of the last pass."""
    text = _QUEUED_SNAPS + (" AND id IN (SELECT job_id FROM reservations)" if reserving else "")
    rows = conn.execute(text, (str(JobState.QUEUED),))
    return [
        JobSnap(i, seq, prio, at, sel, dev, runtime, count, split_ids(ids or ""), who, waits)
        for i, seq, prio, at, sel, dev, runtime, count, ids, who, waits in rows
    ]


def on_device(device_id: str) -> tuple[str, tuple[Any, ...]]:
    """Jobs on ``device_id``: their one device, or one of a several-device job's,
    as a condition and its parameters. Matched as a whole comma-delimited item by
    position, never by pattern, so ``h:g1`` never matches ``h:g10``."""
    item = f",{device_id},"
    return (
        "(jobs.device_id = ? OR (jobs.device_ids != ''"
        " AND strpos(',' || jobs.device_ids || ',', ?) > 0))",
        (device_id, item),
    )
