"""Leases: the unit of exclusivity, and the scheduling pass that grants them.

A device changes hands only here, in ``assign``: one transaction that checks the
device is ``ready`` and the job still ``queued``, flips both, and inserts the lease.
A device that shares its GPU with another of its host (``gpu0`` and ``gpu0.mig1``,
EXT-MIG-3) is not flipped while that one holds a live lease, so the whole GPU and its
MIG instances are never leased at once, whatever any worker reports.
The partial unique index ``leases_one_live_per_device`` refuses a second live lease
even if every check above it were wrong (STORE-010); its violation surfaces as
``LiveLeaseConflict``, never as a silent skip. Every lease carries an epoch from a
counter that never goes back (EXT-EPOCH-1), so a fencing token is never reused even
after retire deletes lease rows.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from enum import StrEnum
from typing import Any

from resource_controller import crashpoints, errors
from resource_controller.core import mig, scheduling, selectors, share
from resource_controller.core.states import DeviceState, JobState
from resource_controller.core.transitions import DEVICE, JOB, Op
from resource_controller.store import moves, queries, sql, usage
from resource_controller.store.fleet import FleetSnapshot
from resource_controller.store.records import (
    Assigned,
    DeviceRecord,
    JobRecord,
    LeaseRecord,
    join_ids,
    split_ids,
)
from resource_controller.store.reserved import KeptReservations

log = logging.getLogger(__name__)

NO_RUNTIME_TTL = 5 * 60  #: lease TTL for a job without a runtime (STORE-052)
RUNTIME_MARGIN = 10 * 60  #: margin over a job's runtime: the worker's watchdog fires first
RENEWAL = 15 * 60  #: a heartbeat naming the job renews its lease to now + this

EPOCH_COUNTER = "lease_epoch"


def deadline(now: int, runtime: int) -> int:
    """The grant-time ``expires_at`` for a job with effective runtime ``runtime`` (STORE-052)."""
    return now + (runtime + RUNTIME_MARGIN if runtime > 0 else NO_RUNTIME_TTL)


def grant(
    conn: queries.Conn, now: int, job: JobRecord, device_id: str, runtime: int
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
        queries.insert_lease(conn, lease._asdict())
    except conn.integrity_errors as exc:
        raise errors.LiveLeaseConflict(
            f"device {device_id} already has a live lease; refusing a second one"
        ) from exc
    return lease


def release_for_job(
    conn: queries.Conn,
    now: int,
    job_id: str,
    util: float | None = None,
    first: Sequence[usage.Held] = (),
) -> list[str]:
    """Release the live leases of ``job_id`` (never of job ``''``); return their devices (STORE-054).

    What they held goes into the usage rollup in this transaction (EXT-ACCT-2), with
    ``first``, the job's leases the caller already released (an expiry ends the lapsed
    one by its own ID), so that a several-device job counts once; ``util`` is the job's
    measured mean GPU utilisation, if any (EXT-ACCT-1).
    """
    released = queries.release_leases(conn, now, job_id) if job_id else []
    usage.account(conn, now, [*first, *released], util)
    return sorted(h.device_id for h in released)


def live(conn: queries.Conn) -> list[LeaseRecord]:
    """Live leases, oldest first (STORE-163)."""
    return [lease_record(r) for r in conn.execute(_LIVE)]


_LEASE_COLS = ", ".join(LeaseRecord._fields)
_LIVE = f"SELECT {_LEASE_COLS} FROM leases WHERE released_at IS NULL ORDER BY acquired_at"
lease_record = LeaseRecord._make


#: The device row at hand shares its GPU with another device of its host that holds a
#: live lease: ``gpu0`` and ``gpu0.mig1`` (``core.mig.overlap``, in SQL). The devices of
#: one worker are read first (``devices_worker``), then each one's live lease by the
#: partial unique index, so a grant costs a look at its own host only.
_OVERLAP_HELD = (
    "EXISTS (SELECT 1 FROM devices s WHERE s.worker_id = devices.worker_id"
    " AND s.id <> devices.id"
    f" AND (substr(s.name, 1, length(devices.name) + {len(mig.SEPARATOR)})"
    f" = devices.name || '{mig.SEPARATOR}'"
    f" OR substr(devices.name, 1, length(s.name) + {len(mig.SEPARATOR)})"
    f" = s.name || '{mig.SEPARATOR}')"
    " AND EXISTS (SELECT 1 FROM leases l WHERE l.device_id = s.id AND l.released_at IS NULL))"
)


class _NotQueued(Exception):
    """Rolls back an assignment whose job left the queue after its device was flipped."""


class _NotReady(Exception):
    """Rolls back a several-device assignment when one of its devices was not ``ready``."""


class Assignment(StrEnum):
    """How one assignment attempt ended."""

    ASSIGNED = "assigned"
    #: The job left the queue since the snapshot (cancelled): reserve nothing.
    NOT_QUEUED = "not_queued"
    #: A device was not ``ready`` any more: the transaction rolled back.
    NOT_READY = "not_ready"


def assign(
    conn: queries.Conn, now: int, job: JobRecord, devices: DeviceRecord | Sequence[DeviceRecord]
) -> Assignment:
    """Give ``devices`` to queued ``job`` (STORE-065, EXT-GANG-2); how that went.

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
    if mig.overlapping(d.name for d in group):
        return Assignment.NOT_READY  # one job, one GPU twice: never (EXT-MIG-3)
    db = conn
    flipped = moves.move(
        db,
        DEVICE,
        Op.ASSIGN,
        queries.id_in(len(ids)) + " AND NOT " + _OVERLAP_HELD,
        ids,
        state=DeviceState.BUSY,
    )
    if flipped != len(ids):
        if flipped == 0:
            return Assignment.NOT_READY  # nothing written
        raise _NotReady(job.id)  # rolls the partial flip back with the transaction
    runtime = scheduling.gang_runtime(
        job.max_runtime_seconds, (d.max_runtime_seconds for d in group)
    )
    moved = moves.move(
        db,
        JOB,
        Op.ASSIGN,
        "id = ?",
        (job.id,),
        state=JobState.ASSIGNED,
        device_id=ids[0],
        device_ids=join_ids(ids) if len(ids) > 1 else "",
        worker_id=group[0].worker_id,
        max_runtime_seconds=runtime,
    )
    if moved != 1:
        raise _NotQueued(job.id)  # rolls the device flips back with the transaction
    for device_id in ids:
        grant(db, now, job, device_id, runtime)
    queries.delete_reservations_of_devices(db, ids)
    crashpoints.hit("grant", ".before_commit")
    return Assignment.ASSIGNED


def _try_assign(
    transaction: Callable[[], AbstractContextManager[sql.Db]],
    now: int,
    job: JobRecord,
    devices: DeviceRecord | Sequence[DeviceRecord],
) -> Assignment:
    try:
        with transaction() as tx:
            return assign(tx, now, job, devices)
    except _NotQueued:
        return Assignment.NOT_QUEUED
    except _NotReady:
        return Assignment.NOT_READY


FIRST_PAGE = 4  #: the first page is small: a pass over a busy fleet stops at the head
QUEUE_PAGE = 32  #: the second page; most passes stop within it
#: Each further page is twice the last, up to this: a pass that walks a queue of 10,000
#: (pinned jobs behind busy devices never saturate the planner) makes 10 queries, not
#: 300. Each page's query walks the index from the queue's head to its keyset (the mixed
#: order cannot seek), so a small cap made a long walk quadratic: 2,048 cost a 10,000-job
#: walk ~25 ms of rescans.
QUEUE_PAGE_MAX = 16384


#: How many jobs' scheduling columns one read fetches at most on a narrow page: the
#: job whose turn it is and those behind it that are not plain pins.
WHOLE_BATCH = 512


class _Walk:
    """The queue in scheduling order (aged at ``now`` when ``aging`` is on, EXT-FAIR-1),
    read a page at a time (keyset on the order), the first page small.

    A pass usually stops early (every device claimed), so reading the whole queue on
    every pass would make each submit cost O(queue length). A page after one made mostly
    of plain pins is read narrow (``queries.WALK_WIDTH`` columns: ID, device, plain pin?):
    a plain pin behind an unavailable device needs nothing more, and every column costs
    about as much to read. The scheduling columns of a narrow row whose turn needs them
    (``scheduling_row``) are read with those of the jobs behind it that are not plain
    pins, up to ``WHOLE_BATCH``, in one query.
    """

    def __init__(
        self,
        read: Callable[[], AbstractContextManager[Any]],
        now: int = 0,
        aging: int = 0,
        skip: Sequence[str] = (),
    ) -> None:
        self._read = read
        self._now, self._aging = now, aging
        #: Share names whose jobs are not read: each is at its limit (EXT-SHARE-1).
        self._skip = skip
        self._page: list[Any] = []
        self._at = 0  #: the index on a narrow page of the row last yielded
        #: The rows before this index that are not plain pins are in ``_rows``.
        self._read_to = 0
        self._rows: dict[str, Any] = {}

    def __iter__(self) -> Iterator[Any]:
        after: tuple[int, int, int] | None = None
        size, narrow = FIRST_PAGE, False
        while True:
            with self._read() as tx:
                page = queries.queue_page(
                    tx, after, size, narrow, self._now, self._aging, self._skip
                )
            self._page, self._read_to, self._rows = page, 0, {}
            if narrow:
                for at, row in enumerate(page):
                    self._at = at  # where ``scheduling_row`` reads on from
                    yield row
            else:
                yield from page
            if len(page) < size:
                return
            after = self.key_of(page[-1])
            if after is None:
                return  # the page's last job is gone: nothing to seek past
            narrow = [r[2] for r in page].count(1) * 2 > len(page)
            size = QUEUE_PAGE if size < QUEUE_PAGE else min(QUEUE_PAGE_MAX, size * 2)

    def scheduling_row(self, row: Any) -> Any:
        """The ``queries.QUEUE_COLS`` of narrow ``row``, the row last yielded (``None`` once
        the job is gone)."""
        job_id = row[0]
        found = self._rows.get(job_id)
        if found is None:
            ids = [job_id]
            page, end = self._page, self._at + 1
            if end > self._read_to:
                while end < len(page) and len(ids) <= WHOLE_BATCH:
                    if not page[end][2]:
                        ids.append(page[end][0])
                    end += 1
                self._read_to = end
            with self._read() as tx:
                self._rows.update((r[0], r) for r in queries.queue_rows(tx, ids))
            found = self._rows.get(job_id)
        return found

    def key_of(self, row: Any) -> tuple[int, int, int] | None:
        """(priority, queued_at, seq) of a row the walk yielded."""
        if len(row) > queries.WALK_WIDTH:
            return (row[_I_PRIORITY], row[_I_QUEUED_AT], row[_I_SEQ])
        with self._read() as tx:
            return queries.queue_key_of(tx, row[0])


class _Queued:
    """A queued row as the pass handles it: its scheduling fields at once, the whole
    record (command and environment, most of a row's bytes) read and decoded only when
    one of its choices is tried, so a walk over 10,000 waiting jobs decodes none of
    them. A row whose record cannot be read fails its assignment and is skipped
    (EXT-LIMITS-3), never placed."""

    __slots__ = ("snap",)

    def __init__(self, row: Any) -> None:
        ids = row[_I_DEVICE_IDS]
        self.snap = scheduling.JobSnap(
            id=row[0],
            seq=row[_I_SEQ],
            priority=row[_I_PRIORITY],
            queued_at=row[_I_QUEUED_AT],
            selector=row[_I_SELECTOR],
            device_id=row[_I_DEVICE_ID],
            max_runtime_seconds=row[_I_MAX_RUNTIME],
            count=max(1, row[_I_COUNT]),
            device_ids=split_ids(ids) if ids else (),
            share=row[_I_SHARE],
        )

    @property
    def id(self) -> str:
        return self.snap.id

    @property
    def selector(self) -> str:
        return self.snap.selector

    def record(self, read: Callable[[], AbstractContextManager[Any]]) -> JobRecord:
        """The whole job, read by ID (the pass holds the store's lock: it is the row
        the walk read)."""
        with read() as tx:
            return queries.job(tx, self.snap.id)


_I_SHARE = queries.QUEUE_COLS.index(queries.SHARE)
_I_PRIORITY = queries.QUEUE_COLS.index("priority")
_I_QUEUED_AT = queries.QUEUE_COLS.index("queued_at")
_I_SEQ = queries.QUEUE_COLS.index("seq")
_I_SELECTOR = queries.QUEUE_COLS.index("selector")
_I_DEVICE_ID = queries.QUEUE_COLS.index("device_id")
_I_DEVICE_IDS = queries.QUEUE_COLS.index("device_ids")
_I_MAX_RUNTIME = queries.QUEUE_COLS.index("max_runtime_seconds")
_I_COUNT = queries.QUEUE_COLS.index("device_count")


def _decode_raw(row: Any) -> JobRecord | None:
    try:
        return queries.job_record(row)
    except Exception:
        _report_skip(str(row[0]), "its row cannot be read")
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
        return exc.__cause__ is not None and sql.row_error(exc.__cause__)
    return not sql.driver_error(exc) or sql.row_error(exc)


def _reserve_vanished(
    transaction: Callable[[], AbstractContextManager[Any]],
    by_id: dict[str, DeviceRecord],
    planner: scheduling.Planner,
    now: int = 0,
    aging: int = 0,
) -> None:
    """Reserve, for the first queued job pinned to it, each device that has no row; a
    job over its submitter's limit claims nothing (EXT-SHARE-1)."""
    with transaction() as tx:
        rows = queries.pinned_elsewhere(tx, list(by_id), now, aging)
    waiting = [job for job in map(_decode_raw, rows) if job]
    for job in waiting:
        snap = job.snap()
        if snap.pinned and planner.limited(snap.share, snap.count) is None:
            for device_id in snap.pins:  # a pinned list claims all of it (EXT-GANG-3)
                planner.reserve(device_id, job.id)


def _turn(
    transaction: Callable[[], AbstractContextManager[sql.Db]],
    read: Callable[[], AbstractContextManager[Any]],
    now: int,
    job: _Queued,
    by_id: dict[str, DeviceRecord],
    planner: scheduling.Planner,
    assigned: list[Assigned],
) -> None:
    """One job's turn in the pass: the planner's choices tried in order, else reserve."""
    snap = job.snap
    try:
        offer = planner.offer(snap)
    except selectors.SelectorError:
        log.error("queued job %s has a selector that no longer parses: %r", job.id, job.selector)
        return
    if offer.limit is not None:
        return  # its submitter is at the limit: it waits and claims nothing (EXT-SHARE-1)
    if not offer.candidates:
        log.warning("queued job %s matches no device it could run on", job.id)
        return
    # Choices are ready devices from the snapshot: nothing readies a device while the
    # pass holds the lock, and each assignment re-checks inside its transaction.
    record = job.record(read) if offer.choices else None
    for choice in offer.choices:
        group = [by_id[d] for d in choice]
        assert record is not None
        outcome = _try_assign(transaction, now, record, group)
        if outcome is Assignment.ASSIGNED:
            crashpoints.hit("grant", ".after_commit")
            planner.placed(snap, choice)
            assigned.append(Assigned(job.id, group[0].worker_id))
            return
        if outcome is Assignment.NOT_QUEUED:
            return  # cancelled since the snapshot: reserve nothing (STORE-063)
    planner.blocked(snap, offer)


@dataclasses.dataclass
class PassEnd:
    """How a pass ended, so the store can tell when a pass right after it would change
    nothing (``Store.schedule_after``)."""

    #: Every reservable device was claimed when the walk ended.
    saturated: bool = False
    #: ``queue_key`` of the last job the walk handled: every job behind it was unplaceable.
    last: tuple[int, int, int] | None = None
    #: The devices the pass saw (a pin to any other is a vanished device's, STORE-062).
    devices: frozenset[str] = frozenset()


def schedule_pass(
    now: int,
    transaction: Callable[[], AbstractContextManager[Any]],
    aging: int = 0,
    read: Callable[[], AbstractContextManager[Any]] | None = None,
    end: PassEnd | None = None,
    fleet: FleetSnapshot | None = None,
    kept: KeptReservations | None = None,
    limits: share.SubmitterLimits = share.NO_LIMITS,
) -> list[Assigned]:
    """One scheduling pass (STORE-061): FIFO by priority, reservations for the blocked.

    ``aging`` > 0 orders by effective priority at ``now`` instead (EXT-FAIR-1).
    ``limits`` are the submitter limits (EXT-SHARE-1): the devices each share name holds
    are read when any applies, and a job over its limit is skipped, claiming nothing.
    Jobs waiting for others to end are not read at all (EXT-SHARE-2).

    The decisions (candidates, what to try, what to claim) are ``core.scheduling``'s
    ``Planner``; this function only reads the snapshot and applies them. Runs with the
    store lock held throughout, so nothing interleaves; each assignment is its own
    transaction (``transaction()``) of conditional updates, and the reservation rows
    are rewritten once at the end, only when they changed. ``read`` (default
    ``transaction``) serves the reads: under the held lock they need no transaction.
    ``end``, when given, is filled in with how the walk ended. ``fleet`` is the store's
    snapshot of the devices, brought up to date here (``store/fleet.py``); a fresh one
    (the whole fleet read) when none is given. ``kept`` is the store's copy of the
    reservation rows (``store/reserved.py``); they are read when none is given.
    """
    read = read or transaction
    fleet = fleet or FleetSnapshot()
    kept = kept or KeptReservations()
    with read() as tx:
        waiting = queries.any_queued(tx)
        old_reservations = kept.read(tx)
        if waiting:
            by_id, index = fleet.index(tx)
            held = held_by_share(tx) if limits.on else {}
    if not waiting:
        # Nothing waits, so nothing is placed and no reservation stands (STORE-062);
        # a pass on an empty queue reads no device, or every kick costs O(fleet).
        if old_reservations:
            _rewrite(transaction, kept, now, {})
        return []
    # Names at their limit when the pass begins stay there (what it places only adds):
    # their jobs are not read at all, which is most of a queue from people at their limit.
    walk = _Walk(read, now, aging, share.at_limit(limits, held) if limits.on else ())
    planner = scheduling.Planner(index, limits, held)
    limited = planner.limited_on
    assigned: list[Assigned] = []
    last: Any = None  #: the row of the last job the walk handled
    for row in walk:
        if planner.full:
            # Every device is claimed: no job further back can be placed, and the only
            # reservations left to write are those of jobs pinned to devices that no
            # longer exist (STORE-062), which one query finds.
            _reserve_vanished(read, by_id, planner, now, aging)
            break
        last = row
        try:
            # A plain pin whose device cannot be had now (claimed by a job ahead, taken,
            # busy, out of the pool or draining) can only claim it (STORE-062): done
            # here without building the job, the common case of a long pinned queue.
            if row[2]:
                if limited and planner.limited(row[3], 1) is not None:
                    continue  # over its submitter's limit: waits, claims nothing
                if planner.claim_unless_free(row[1], row[0]):
                    continue
            whole = row if len(row) > queries.WALK_WIDTH else walk.scheduling_row(row)
            if whole is None:
                continue  # gone from under the pass: another process's edit
            if limited and planner.limited(row[3], max(1, whole[_I_COUNT])) is not None:
                continue  # as above, before the job is built: a queue of one name's jobs
            _turn(transaction, read, now, _Queued(whole), by_id, planner, assigned)
        except Exception as exc:
            # One bad row never stops the fleet (EXT-LIMITS-3): its assignment rolled
            # back, it reserves nothing, and the jobs behind it are still placed.
            if not _row_fault(exc):
                raise
            _report_skip(str(row[0]), f"{type(exc).__name__}: {exc}")
    if end is not None:
        key = walk.key_of(last) if last is not None else None
        end.saturated, end.devices = planner.saturated(), frozenset(by_id)
        end.last = (-key[0], key[1], key[2]) if key else None
    # Each assignment already deleted its device's row (STORE-065 step 6).
    taken = planner.taken
    current = (
        {d: j for d, j in old_reservations.items() if d not in taken} if taken else old_reservations
    )
    if planner.reserved != current:
        _rewrite(transaction, kept, now, planner.reserved)
    return assigned


def held_by_share(db: sql.Db) -> dict[str, int]:
    """The devices each share name holds (EXT-SHARE-1), as migration 0010's triggers keep
    them from the live leases."""
    return {str(name): int(n) for name, n in db.execute(_HELD)}


_HELD = "SELECT share_name, devices FROM share_held WHERE devices > 0"


def _rewrite(
    transaction: Callable[[], AbstractContextManager[Any]],
    kept: KeptReservations,
    now: int,
    rows: dict[str, str],
) -> None:
    """Replace the reservation rows with ``rows`` (device -> job), and keep them."""
    kept.forget()  # until the write commits
    with transaction() as tx:
        queries.replace_reservations(tx, now, sorted((j, d) for d, j in rows.items()))
    kept.wrote(tx, dict(rows))
