"""Leases: the unit of exclusivity, and the scheduling pass that grants them.

A device changes hands only here, in ``assign``: one transaction that checks the
device is ``ready`` and the job still ``queued``, flips both, and inserts the lease.
The partial unique index ``leases_one_live_per_device`` refuses a second live lease
even if every check above it were wrong (STORE-010); its violation surfaces as
``LiveLeaseConflict``, never as a silent skip. Every lease carries an epoch from a
counter that never goes back (EXT-EPOCH-1), so a fencing token is never reused even
after retire deletes lease rows.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import sqlalchemy as sa

from resource_controller import crashpoints, errors
from resource_controller.core import scheduling, selectors
from resource_controller.core.states import DeviceState, JobState
from resource_controller.core.transitions import DEVICE, JOB, Op
from resource_controller.store import moves, queries
from resource_controller.store import schema as t
from resource_controller.store.records import (
    Assigned,
    DeviceRecord,
    JobRecord,
    LeaseRecord,
    join_ids,
)

log = logging.getLogger(__name__)

NO_RUNTIME_TTL = 5 * 60  #: lease TTL for a job without a runtime (STORE-052)
RUNTIME_MARGIN = 10 * 60  #: margin over a job's runtime: the worker's watchdog fires first
RENEWAL = 15 * 60  #: a heartbeat naming the job renews its lease to now + this

EPOCH_COUNTER = "lease_epoch"


def deadline(now: int, runtime: int) -> int:
    """The grant-time ``expires_at`` for a job with effective runtime ``runtime`` (STORE-052)."""
    return now + (runtime + RUNTIME_MARGIN if runtime > 0 else NO_RUNTIME_TTL)


def grant(
    conn: sa.Connection, now: int, job: JobRecord, device_id: str, runtime: int
) -> LeaseRecord:
    """Insert the live lease for ``job`` on ``device_id``; the unique index is the referee."""
    lease = LeaseRecord(
        id=str(uuid.uuid4()),
        device_id=device_id,
        holder=job.submitter,
        job_id=job.id,
        acquired_at=now,
        expires_at=deadline(now, runtime),
        released_at=None,
        kind=job.kind,
        reason=job.reason,
        epoch=queries.next_counter(conn, EPOCH_COUNTER),
    )
    try:
        conn.execute(sa.insert(t.leases).values(**lease.__dict__))
    except sa.exc.IntegrityError as exc:
        raise errors.LiveLeaseConflict(
            f"device {device_id} already has a live lease; refusing a second one"
        ) from exc
    return lease


def release_for_job(conn: sa.Connection, now: int, job_id: str) -> list[str]:
    """Release the live leases of ``job_id`` (never of job ``''``); return their devices (STORE-054)."""
    if not job_id:
        return []
    live = [
        r.device_id
        for r in conn.execute(
            sa.select(t.leases.c.device_id).where(
                t.leases.c.job_id == job_id, t.leases.c.released_at.is_(None)
            )
        )
    ]
    if live:
        conn.execute(
            sa.update(t.leases)
            .where(t.leases.c.job_id == job_id, t.leases.c.released_at.is_(None))
            .values(released_at=now)
        )
    return live


def live(conn: sa.Connection) -> list[LeaseRecord]:
    """Live leases, oldest first (STORE-163)."""
    q = sa.select(t.leases).where(t.leases.c.released_at.is_(None))
    return [LeaseRecord.from_row(r) for r in conn.execute(q.order_by(t.leases.c.acquired_at))]


class _NotQueued(Exception):
    """Rolls back an assignment whose job left the queue after its device was flipped."""


class _NotReady(Exception):
    """Rolls back a several-device assignment when one of its devices was not ``ready``."""


def assign(
    conn: sa.Connection, now: int, job: JobRecord, devices: DeviceRecord | Sequence[DeviceRecord]
) -> str:
    """Give ``devices`` to queued ``job`` (STORE-065, EXT-GANG-2); assigned / not_ready / not_queued.

    ``job`` and the devices come from the pass's snapshot. The conditional updates
    re-check both inside this transaction, devices first (STORE-063), so a stale
    snapshot can never hand out a device that is not ``ready``; the unique index
    still referees each lease insert. Several devices are all or nothing: every one
    flips and gets its lease in this one transaction, or the transaction rolls back.
    Their leases are granted in ascending ID order, so their epochs are consecutive
    and the job's ``lease_epoch`` (the largest) is the last device's (EXT-EPOCH-3a).
    """
    group = sorted([devices] if isinstance(devices, DeviceRecord) else devices, key=lambda d: d.id)
    ids = [d.id for d in group]
    flipped = moves.move(conn, DEVICE, Op.ASSIGN, t.devices.c.id.in_(ids), state=DeviceState.BUSY)
    if flipped != len(ids):
        if flipped == 0:
            return "not_ready"  # nothing written
        raise _NotReady(job.id)  # rolls the partial flip back with the transaction
    runtime = scheduling.gang_runtime(job.max_runtime, (d.max_runtime for d in group))
    moved = moves.move(
        conn,
        JOB,
        Op.ASSIGN,
        t.jobs.c.id == job.id,
        state=JobState.ASSIGNED,
        device_id=ids[0],
        device_ids=join_ids(ids) if len(ids) > 1 else "",
        worker_id=group[0].worker_id,
        max_runtime=runtime,
    )
    if moved != 1:
        raise _NotQueued(job.id)  # rolls the device flips back with the transaction
    for device_id in ids:
        grant(conn, now, job, device_id, runtime)
    conn.execute(sa.delete(t.reservations).where(t.reservations.c.device_id.in_(ids)))
    crashpoints.hit("grant", ".before_commit")
    return "assigned"


def _try_assign(
    transaction: Callable[[], AbstractContextManager[sa.Connection]],
    now: int,
    job: JobRecord,
    devices: DeviceRecord | Sequence[DeviceRecord],
) -> str:
    try:
        with transaction() as tx:
            return assign(tx, now, job, devices)
    except _NotQueued:
        return "not_queued"
    except _NotReady:
        return "not_ready"


QUEUE_PAGE = 32  #: queued jobs read by the first query; most passes stop within it
#: Each further page is twice the last, up to this: a pass that walks a queue of 10,000
#: (pinned jobs behind busy devices never saturate the planner) makes ~15 queries, not 300.
QUEUE_PAGE_MAX = 2048


def _queued_in_order(
    transaction: Callable[[], AbstractContextManager[sa.Connection]],
    now: int = 0,
    aging: int = 0,
) -> Iterator[JobRecord]:
    """Queued jobs in scheduling order (aged at ``now`` when ``aging`` is on, EXT-FAIR-1),
    read a page at a time (keyset on the order).

    A pass usually stops early (every device claimed), so reading the whole queue on
    every pass would make each submit cost O(queue length). A row that cannot be read
    is skipped and logged, never the end of the pass (EXT-LIMITS-3).
    """
    j = t.jobs.c
    after: sa.Row[Any] | None = None
    page = QUEUE_PAGE
    while True:
        where = [j.state == JobState.QUEUED]
        if after is not None:
            where.append(queries.behind(after, now, aging))
        with transaction() as tx:
            q_page = sa.select(t.jobs).where(*where).order_by(*queries.queue_order(now, aging))
            rows = tx.execute(q_page.limit(page)).all()
        for row in rows:
            job = _decode(row)
            if job is not None:
                yield job
        if len(rows) < page:
            return
        after = rows[-1]
        page = min(QUEUE_PAGE_MAX, page * 2)


def _decode(row: sa.Row[Any]) -> JobRecord | None:
    """The row as a record; None (logged) when it cannot be read, so the pass goes on."""
    try:
        return JobRecord.from_row(row)
    except Exception:
        _report_skip(str(row.id), "its row cannot be read")
        return None


#: Jobs already reported as skipped; a pass runs every second, the log says it once.
_skipped: set[str] = set()


def _report_skip(job_id: str, why: str) -> None:
    """Log a job the pass cannot handle, with its ID (EXT-LIMITS-3); once per job."""
    if job_id in _skipped:
        log.debug("queued job %s skipped again: %s", job_id, why)
        return
    if len(_skipped) >= 10_000:
        _skipped.clear()
    _skipped.add(job_id)
    log.error("queued job %s skipped by the scheduling pass: %s", job_id, why, exc_info=True)


def _row_fault(exc: Exception) -> bool:
    """True when ``exc`` comes from one job's own data rather than from a database outage."""
    if isinstance(exc, errors.StoreError):
        return isinstance(exc.__cause__, (sa.exc.DataError, sa.exc.IntegrityError))
    return True


def _reserve_vanished(
    transaction: Callable[[], AbstractContextManager[sa.Connection]],
    by_id: dict[str, DeviceRecord],
    planner: scheduling.Planner,
    order: tuple[sa.UnaryExpression[Any], ...] = queries.QUEUE_ORDER,
) -> None:
    """Reserve, for the first queued job pinned to it, each device that has no row."""
    j = t.jobs.c
    with transaction() as tx:
        waiting = queries.jobs_where(
            tx,
            j.state == JobState.QUEUED,
            j.device_id != "",
            j.device_id.not_in(list(by_id)),
            order=order,
        )
    for job in waiting:
        snap = job.snap()
        if snap.pinned:
            for device_id in snap.pins:  # a pinned list claims all of it (EXT-GANG-3)
                planner.reserve(device_id, job.id)


def _turn(
    transaction: Callable[[], AbstractContextManager[sa.Connection]],
    now: int,
    job: JobRecord,
    by_id: dict[str, DeviceRecord],
    planner: scheduling.Planner,
    assigned: list[Assigned],
) -> None:
    """One job's turn in the pass: the planner's choices tried in order, else reserve."""
    snap = job.snap()
    try:
        offer = planner.offer(snap)
    except selectors.SelectorError:
        log.error("queued job %s has a selector that no longer parses: %r", job.id, job.selector)
        return
    if not offer.candidates:
        log.warning("queued job %s matches no device it could run on", job.id)
        return
    # Choices are ready devices from the snapshot: nothing readies a device while the
    # pass holds the lock, and each assignment re-checks inside its transaction.
    for choice in offer.choices:
        group = [by_id[d] for d in choice]
        outcome = _try_assign(transaction, now, job, group)
        if outcome == "assigned":
            crashpoints.hit("grant", ".after_commit")
            planner.placed(snap, choice)
            assigned.append(Assigned(job.id, group[0].worker_id))
            return
        if outcome == "not_queued":
            return  # cancelled since the snapshot: reserve nothing (STORE-063)
    planner.blocked(snap, offer)


def schedule_pass(
    conn: sa.Connection,
    now: int,
    transaction: Callable[[], AbstractContextManager[sa.Connection]],
    aging: int = 0,
) -> list[Assigned]:
    """One scheduling pass (STORE-061): FIFO by priority, reservations for the blocked.

    ``aging`` > 0 orders by effective priority at ``now`` instead (EXT-FAIR-1).

    The decisions (candidates, what to try, what to claim) are ``core.scheduling``'s
    ``Planner``; this function only reads the snapshot and applies them. Runs with the
    store lock held throughout, so nothing interleaves; each assignment is its own
    transaction (``transaction()``) of conditional updates, and the reservation rows
    are rewritten once at the end, only when they changed.
    """
    with transaction() as tx:
        if not queries.any_queued(tx):
            # Nothing waits, so nothing is placed and no reservation stands (STORE-062);
            # a pass on an empty queue reads no device, or every kick costs O(fleet).
            if tx.execute(sa.select(t.reservations.c.device_id).limit(1)).first() is not None:
                tx.execute(sa.delete(t.reservations))
            return []
        old_reservations = {(r.job_id, r.device_id) for r in tx.execute(sa.select(t.reservations))}
        devices = queries.all_devices(tx)
        labels = queries.effective_labels(tx)
    queue = _queued_in_order(transaction, now, aging)
    by_id = {d.id: d for d in devices}
    planner = scheduling.Planner(queries.device_snaps(devices, labels))
    assigned: list[Assigned] = []
    for job in queue:
        if planner.saturated():
            # Every device is claimed: no job further back can be placed, and the only
            # reservations left to write are those of jobs pinned to devices that no
            # longer exist (STORE-062), which one query finds.
            _reserve_vanished(transaction, by_id, planner, queries.queue_order(now, aging))
            break
        try:
            _turn(transaction, now, job, by_id, planner, assigned)
        except Exception as exc:
            # One bad row never stops the fleet (EXT-LIMITS-3): its assignment rolled
            # back, it reserves nothing, and the jobs behind it are still placed.
            if not _row_fault(exc):
                raise
            _report_skip(job.id, f"{type(exc).__name__}: {exc}")
    new_reservations = {(job_id, device_id) for device_id, job_id in planner.reserved.items()}
    # Each assignment already deleted its device's row (STORE-065 step 6).
    current = {(j, d) for j, d in old_reservations if d not in planner.taken}
    if new_reservations != current:
        with transaction() as tx:
            tx.execute(sa.delete(t.reservations))
            if new_reservations:
                tx.execute(
                    sa.insert(t.reservations),
                    [{"job_id": j, "device_id": d, "created_at": now} for j, d in new_reservations],
                )
    return assigned
