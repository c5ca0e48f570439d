"""The scheduling pass on the database: ``core.passloop.run_pass`` over the queue as
the store reads it, in one transaction that holds the pass lock, each placement a
savepoint of it (``leases.assign``).

The rules decide (``core.scheduling``); this module only reads what they need, a page
of the queue at a time, and applies what they decide. A pass usually stops early (every
device claimed), so reading the whole queue each time would make each submit cost
O(queue length); and a long pinned queue behind busy devices needs, of each job, only
the first columns of its row (``queries.WALK_WIDTH``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from resource_controller import errors
from resource_controller.core import passloop, scheduling, share
from resource_controller.core.passloop import Placement
from resource_controller.core.scheduling import JobSnap
from resource_controller.store import leases, queries, sql
from resource_controller.store.fleet import FleetSnapshot
from resource_controller.store.records import Assigned, DeviceRecord, JobRecord, split_ids
from resource_controller.store.reserved import KeptReservations

log = logging.getLogger(__name__)

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


class QueueWalk:
    """The queue in scheduling order (aged at ``now`` when ``aging`` is on),
    read a page at a time (keyset on the order), the first page small: the
    ``core.passloop.Queue`` the pass runs over.

    A page after one made mostly of plain pins is read narrow (``queries.WALK_WIDTH``
    columns): a plain pin behind an unavailable device needs nothing more, and every
    column costs about as much to read. The scheduling columns of a narrow row whose
    turn needs them (``snap``) are read with those of the jobs behind it that are not
    plain pins, up to ``WHOLE_BATCH``, in one query.
    """

    def __init__(
        self,
        db: sql.Db,
        now: int = 0,
        aging: int = 0,
        skip: Sequence[str] = (),
        known: Iterable[str] = (),
    ) -> None:
        self._db = db
        self._now, self._aging = now, aging
        #: Share names whose jobs are not read: each is at its limit.
        self._skip = skip
        #: The devices the pass sees: a pin to any other is a vanished device's.
        self._known = known
        self._page: list[Any] = []
        self._at = 0  #: the index on a narrow page of the row last yielded
        #: The rows before this index that are not plain pins are in ``_rows``.
        self._read_to = 0
        self._rows: dict[str, Any] = {}
        #: The row last yielded: where the walk ended.
        self.last: Any = None

    def __iter__(self) -> Iterator[Any]:
        after: tuple[int, int, int] | None = None
        size, narrow = FIRST_PAGE, False
        while True:
            page = queries.queue_page(
                self._db, after, size, narrow, self._now, self._aging, self._skip
            )
            self._page, self._read_to, self._rows = page, 0, {}
            for at, row in enumerate(page):
                self._at, self.last = at, row  # where ``scheduling_row`` reads on from
                yield row
            if len(page) < size:
                return
            after = self.key_of(page[-1])
            if after is None:
                return  # the page's last job is gone: nothing to seek past
            narrow = [r[2] for r in page].count(1) * 2 > len(page)
            size = QUEUE_PAGE if size < QUEUE_PAGE else min(QUEUE_PAGE_MAX, size * 2)

    def snap(self, row: Any) -> JobSnap | None:
        """The job of a row the walk yielded; None once it is gone or cannot be read
        (EXT-LIMITS-3: one bad row never stops the fleet)."""
        try:
            whole = row if len(row) > queries.WALK_WIDTH else self.scheduling_row(row)
            return None if whole is None else _snap(whole)
        except Exception as exc:
            if not _row_fault(exc):
                raise
            _report_skip(str(row[0]), f"{type(exc).__name__}: {exc}")
            return None

    def pinned_elsewhere(self) -> list[JobSnap]:
        rows = queries.pinned_elsewhere(self._db, list(self._known), self._now, self._aging)
        return [job.snap() for job in map(_decode_raw, rows) if job]

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
            self._rows.update((r[0], r) for r in queries.queue_rows(self._db, ids))
            found = self._rows.get(job_id)
        return found

    def key_of(self, row: Any) -> tuple[int, int, int] | None:
        """(priority, queued_at, seq) of a row the walk yielded."""
        if len(row) > queries.WALK_WIDTH:
            return (row[_I_PRIORITY], row[_I_QUEUED_AT], row[_I_SEQ])
        return queries.queue_key_of(self._db, row[0])


_I_SHARE = queries.QUEUE_COLS.index(queries.SHARE)
_I_PRIORITY = queries.QUEUE_COLS.index("priority")
_I_QUEUED_AT = queries.QUEUE_COLS.index("queued_at")
_I_SEQ = queries.QUEUE_COLS.index("seq")
_I_SELECTOR = queries.QUEUE_COLS.index("selector")
_I_DEVICE_ID = queries.QUEUE_COLS.index("device_id")
_I_DEVICE_IDS = queries.QUEUE_COLS.index("device_ids")
_I_MAX_RUNTIME = queries.QUEUE_COLS.index("max_runtime_seconds")
_I_COUNT = queries.QUEUE_COLS.index("device_count")


def _snap(row: Any) -> JobSnap:
    """What the rules read of a job, from its ``queries.QUEUE_COLS`` (as ``JobRecord.snap``
    would from the whole row, which is read only when the job is placed)."""
    ids = row[_I_DEVICE_IDS]
    return JobSnap(
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


def _decode_raw(row: Any) -> JobRecord | None:
    try:
        return queries.job_record(row)
    except Exception:
        _report_skip(str(row[0]), "its row cannot be read")
        return None


#: Jobs already reported as skipped; a pass runs every second, the log says it once.
_skipped: set[str] = set()


def _report_skip(job_id: str, why: str) -> None:
    """Log a job the pass cannot handle, with its ID; once per job."""
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


class _Placer:
    """Places a job as the rules chose: one savepoint per choice tried. The whole record
    (command and environment, most of a row's bytes) is read only here, so a walk over
    10,000 waiting jobs decodes none of them."""

    def __init__(
        self,
        db: sql.Db,
        now: int,
        by_id: dict[str, DeviceRecord],
        limits: share.SubmitterLimits,
    ) -> None:
        self._db, self._now, self._by_id, self._limits = db, now, by_id, limits
        self._record: JobRecord | None = None
        self.assigned: list[Assigned] = []

    def __call__(self, job: JobSnap, choice: tuple[str, ...]) -> Placement:
        try:
            return self._place(job, choice)
        except Exception as exc:
            # Its assignment rolled back and it claims nothing; the jobs behind it are
            # still placed.
            if not _row_fault(exc):
                raise
            _report_skip(job.id, f"{type(exc).__name__}: {exc}")
            return Placement.GONE

    def _place(self, job: JobSnap, choice: tuple[str, ...]) -> Placement:
        record = self._record
        if record is None or record.id != job.id:
            record = self._record = queries.job(self._db, job.id)
        # Choices are devices the pass's view holds ready; the assignment re-checks
        # every condition of the grant against the rows.
        group = [self._by_id[d] for d in choice]
        placement = leases.try_assign(
            lambda: self._db.savepoint("placement"), self._now, record, group, self._limits
        )
        if placement is Placement.PLACED:
            self.assigned.append(Assigned(job.id, group[0].worker_id))
        return placement


@dataclasses.dataclass
class PassEnd:
    """How a pass ended, so the store can tell when a pass right after it would change
    nothing (``Store.schedule_after``)."""

    #: Every reservable device was claimed when the walk ended.
    saturated: bool = False
    #: ``queue_key`` of the last job the walk read: every job behind it was unplaceable.
    last: tuple[int, int, int] | None = None
    #: The devices the pass saw (a pin to any other is a vanished device's).
    devices: frozenset[str] = frozenset()


def schedule_pass(
    db: sql.Db,
    now: int,
    aging: int = 0,
    end: PassEnd | None = None,
    fleet: FleetSnapshot | None = None,
    kept: KeptReservations | None = None,
    limits: share.SubmitterLimits = share.NO_LIMITS,
) -> list[Assigned]:
    """One scheduling pass in the open transaction ``db``: FIFO by priority,
    reservations for the blocked.

    The caller holds the pass lock (``locks.SCHEDULING_PASS``) for the transaction.
    ``aging`` > 0 orders by effective priority at ``now`` instead. ``limits`` are the
    submitter limits: the devices each share name holds are read when any applies. Each
    assignment is a savepoint, and the reservation rows are rewritten once at the end,
    only when they changed. ``end``, when given, is filled in with how the walk ended.
    ``fleet`` is the store's view of the devices, brought up to date here
    (``store/fleet.py``); ``kept`` is the store's copy of the reservation rows
    (``store/reserved.py``).
    """
    fleet = fleet or FleetSnapshot()
    kept = kept or KeptReservations()
    old_reservations = kept.read(db)
    if not queries.any_queued(db):
        # Nothing waits, so nothing is placed and no reservation stands;
        # a pass on an empty queue reads no device, or every kick costs O(fleet).
        if old_reservations:
            _rewrite(db, kept, now, old_reservations, {})
        return []
    by_id, index = fleet.index(db)
    held = held_by_share(db) if limits.on else {}
    # Names at their limit when the pass begins stay there (what it places only adds):
    # their jobs are not read at all, which is most of a queue from people at their limit.
    skip = share.at_limit(limits, held) if limits.on else ()
    walk = QueueWalk(db, now, aging, skip, by_id)
    planner = scheduling.Planner(index, limits, held)
    placer = _Placer(db, now, by_id, limits)
    plan = passloop.run_pass(walk, planner, placer)
    for job_id in plan.unparsable:
        log.error("queued job %s has a selector that no longer parses", job_id)
    for job_id in plan.unmatched:
        log.warning("queued job %s matches no device it could run on", job_id)
    if end is not None:
        key = walk.key_of(walk.last) if walk.last is not None else None
        end.saturated, end.devices = planner.saturated(), frozenset(by_id)
        end.last = (-key[0], key[1], key[2]) if key else None
    # Each assignment already deleted its device's row.
    taken = planner.taken
    current = (
        {d: j for d, j in old_reservations.items() if d not in taken} if taken else old_reservations
    )
    if plan.reservations != current:
        _rewrite(db, kept, now, current, plan.reservations)
    return placer.assigned


def held_by_share(db: sql.Db) -> dict[str, int]:
    """The devices each share name holds, as migration 0010's triggers keep
    them from the live leases."""
    return {str(name): int(n) for name, n in db.execute(_HELD)}


_HELD = "SELECT share_name, devices FROM share_held WHERE devices > 0"


def _rewrite(
    db: sql.Db, kept: KeptReservations, now: int, old: dict[str, str], rows: dict[str, str]
) -> None:
    """Turn the reservation rows ``old`` into ``rows`` (device -> job), writing only what
    differs, and keep them (the store forgets them if the transaction rolls back)."""
    gone = [d for d in old if d not in rows]
    changed = sorted((j, d) for d, j in rows.items() if old.get(d) != j)
    queries.update_reservations(db, now, gone, changed)
    kept.wrote(db, dict(rows))
