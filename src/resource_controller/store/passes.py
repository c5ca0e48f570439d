"""The scheduling pass on the database: ``core.passloop.run_pass`` in one transaction holding the
pass lock, the queue read a page at a time (a pass usually stops early)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

from resource_controller import errors
from resource_controller.core import arrays, passloop, preempt, scheduling, share
from resource_controller.core.passloop import Placement
from resource_controller.core.planner import Planner
from resource_controller.core.scheduling import JobSnap
from resource_controller.store import leases, queries, sql
from resource_controller.store.queries import QueueEntry, QueueRow
from resource_controller.store.records import (
    Assigned,
    DeviceRecord,
    JobRecord,
    Preempted,
    split_ids,
)

if TYPE_CHECKING:
    from resource_controller.store.base import Core

log = logging.getLogger(__name__)

FIRST_PAGE = 4  #: the first page is small: a pass over a busy fleet stops at the head
QUEUE_PAGE = 32  #: the second page; most passes stop within it
#: Each further page is twice the last, up to this: each page rescans from the head, so a small cap
#: was quadratic.
QUEUE_PAGE_MAX = 16384
#: Jobs whose ``QueueRow`` one read of a narrow page fetches at most.
WHOLE_BATCH = 512


class QueueWalk:
    """The queue in scheduling order, a page at a time (keyset), narrow behind plain pins."""

    def __init__(
        self,
        db: sql.Db,
        now: int = 0,
        aging: int = 0,
        skip: Sequence[str] = (),
        known: Iterable[str] = (),
        full: Iterable[str] = (),
    ) -> None:
        self._db = db
        self._now, self._aging = now, aging
        #: Share names whose jobs are not read: each is at its limit.
        self._skip = skip
        #: Arrays at their ``%N`` cap, as the pass finds them: the next page leaves their tasks out.
        self._full = full
        #: The devices the pass sees: a pin to any other is a vanished device's.
        self._known = known
        self._page: Sequence[QueueRow | QueueEntry] = []
        self._at = 0  #: the index on a narrow page of the row last yielded
        #: The rows before this index that are not plain pins are in ``_rows``.
        self._read_to = 0
        self._rows: dict[str, QueueRow] = {}
        #: The row last yielded: where the walk ended.
        self.last: QueueRow | QueueEntry | None = None

    def __iter__(self) -> Iterator[QueueRow | QueueEntry]:
        after: tuple[int, int, int] | None = None
        size, narrow = FIRST_PAGE, False
        while True:
            page = queries.queue_page(
                self._db,
                after,
                size,
                narrow,
                self._now,
                self._aging,
                self._skip,
                sorted(self._full),
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
            narrow = sum(bool(r.plain_pin) for r in page) * 2 > len(page)
            size = QUEUE_PAGE if size < QUEUE_PAGE else min(QUEUE_PAGE_MAX, size * 2)

    def snap(self, entry: Sequence[Any]) -> JobSnap | None:
        """The job of a yielded row; None once gone or unreadable (EXT-LIMITS-3)."""
        row = cast(QueueRow | QueueEntry, entry)
        try:
            whole = row if isinstance(row, QueueRow) else self.scheduling_row(row)
            return None if whole is None else queries.snap(whole)
        except Exception as exc:
            if not _row_fault(exc):
                raise
            _report_skip(str(row.id), f"{type(exc).__name__}: {exc}")
            return None

    def pinned_elsewhere(self) -> list[JobSnap]:
        rows = queries.pinned_elsewhere(self._db, list(self._known), self._now, self._aging)
        return [job.snap() for job in map(_decode_raw, rows) if job]

    def scheduling_row(self, row: QueueEntry) -> QueueRow | None:
        """The ``QueueRow`` of narrow ``row``, the last yielded (``None`` once the job is gone)."""
        found = self._rows.get(row.id)
        if found is None:
            ids = [row.id]
            page, end = self._page, self._at + 1
            if end > self._read_to:
                while end < len(page) and len(ids) <= WHOLE_BATCH:
                    if not page[end].plain_pin:
                        ids.append(page[end].id)
                    end += 1
                self._read_to = end
            self._rows.update((r.id, r) for r in queries.queue_rows(self._db, ids))
            found = self._rows.get(row.id)
        return found

    def key_of(self, row: QueueRow | QueueEntry) -> tuple[int, int, int] | None:
        """(priority, queued_at, seq) of a row the walk yielded."""
        if isinstance(row, QueueRow):
            return row.priority, row.queued_at, row.seq
        found = self._db.one("SELECT priority, queued_at, seq FROM jobs WHERE id = ?", (row.id,))
        return None if found is None else (found[0], found[1], found[2])


def _decode_raw(row: Sequence[Any]) -> JobRecord | None:
    try:
        return queries.job_record(row)
    except Exception:
        _report_skip(str(row[_JOB_ID]), "its row cannot be read")
        return None


_JOB_ID = queries.JOB_COLS.index("id")


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
    """Places a job as the rules chose, a savepoint per choice; only here is a whole record read."""

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
            record = self._record
            if record is None or record.id != job.id:
                record = self._record = queries.job(self._db, job.id)
            # The assignment re-checks every condition of the grant against the rows.
            group = [self._by_id[d] for d in choice]
            placement = leases.try_assign(
                lambda: self._db.savepoint("placement"), self._now, record, group, self._limits
            )
        except Exception as exc:
            # Its assignment rolled back and it claims nothing; the jobs behind it are still placed.
            if not _row_fault(exc):
                raise
            _report_skip(job.id, f"{type(exc).__name__}: {exc}")
            return Placement.GONE
        if placement is Placement.PLACED:
            self.assigned.append(Assigned(job.id, group[0].worker_id))
        return placement


@dataclasses.dataclass
class PassEnd:
    """How a pass ended: whether a pass right after it could change anything."""

    #: Every reservable device was claimed when the walk ended.
    saturated: bool = False
    #: ``queue_key`` of the last job the walk read: every job behind it was unplaceable.
    last: tuple[int, int, int] | None = None
    #: The devices the pass saw (a pin to any other is a vanished device's).
    devices: frozenset[str] = frozenset()
    #: Victims it chose (EXT-PREEMPT-1).
    preempted: list[Preempted] = dataclasses.field(default_factory=list)
    #: A preemptible job runs: a job submitted behind the queue's end may still preempt it.
    stoppable: bool = False


def schedule_pass(db: sql.Db, core: Core) -> tuple[list[Assigned], PassEnd]:
    """One scheduling pass in ``db``'s transaction (which holds ``locks.SCHEDULING_PASS``), each
    assignment a savepoint; what it placed and how it ended."""
    now, aging, limits, kept = core.now(), core.aging, core.limits, core.reserved
    old_reservations = kept.read(db)
    # One probe of the ``jobs_queue`` index, however long the history.
    if db.one("SELECT 1 FROM jobs WHERE state = 'queued' LIMIT 1") is None:
        # Nothing waits, so nothing is placed: an empty queue's pass reads no device.
        if old_reservations:
            _rewrite(db, kept, now, old_reservations, {})
        return [], PassEnd()
    by_id, index = core.fleet.index(db)
    held = held_by_share(db) if limits.on else {}
    # Names at their limit stay there (placing only adds): their jobs are not read at all.
    skip = share.at_limit(limits, held) if limits.on else ()
    caps = arrays.ArrayCaps(lambda array_id: array_cap(db, array_id))
    walk = QueueWalk(db, now, aging, skip, by_id, caps.full)
    chooser = _preemption(db, core.preemption, now)
    planner = Planner(index, limits, held, chooser, caps)
    placer = _Placer(db, now, by_id, limits)
    plan = passloop.run_pass(walk, planner, placer)
    for job_id in plan.unparsable:
        log.error("queued job %s has a selector that no longer parses", job_id)
    for job_id in plan.unmatched:
        log.warning("queued job %s matches no device it could run on", job_id)
    end = PassEnd(planner.saturated(), devices=frozenset(by_id))
    if chooser is not None:
        end.preempted = _stop(db, plan.preempt, chooser)
        # Read only for a pass that would leave the queue settled.
        end.stoppable = end.saturated and not placer.assigned and chooser.stoppable()
    key = walk.key_of(walk.last) if walk.last is not None else None
    if key is not None:
        priority, queued_at, seq = key
        end.last = (-priority, queued_at, seq)
    # Each assignment already deleted its device's row.
    taken = planner.taken
    current = (
        {d: j for d, j in old_reservations.items() if d not in taken} if taken else old_reservations
    )
    if plan.reservations != current:
        _rewrite(db, kept, now, current, plan.reservations)
    return placer.assigned, end


def array_cap(db: sql.Db, array_id: str) -> tuple[int, int]:
    """An array's ``%N`` cap and its tasks assigned or running (0, 0 for an array with no row)."""
    cap = int(db.value("SELECT max_running FROM arrays WHERE id = ?", (array_id,)) or 0)
    if cap <= 0:
        return 0, 0
    # ``array_id != ''`` lets the partial index ``jobs_array`` serve.
    active = db.value(
        f"SELECT count(*) FROM jobs WHERE array_id = ? AND array_id != '' AND {_ACTIVE}",
        (array_id,),
    )
    return cap, int(active or 0)


def _preemption(db: sql.Db, rules: preempt.Settings, now: int) -> preempt.Preemption | None:
    """The pass's preemption, its snapshots read only when a job waits that could use them."""
    if not rules.on:
        return None

    def running() -> list[preempt.Running]:
        return [
            preempt.Running(
                str(job_id),
                split_ids(ids) if ids else (str(device_id),),
                int(priority),
                int(started or 0),
                str(by),
                str(worker),
                kind == "hold",
            )
            for job_id, device_id, ids, priority, started, by, worker, kind in db.all(_RUNNING)
        ]

    def promised() -> dict[str, str]:
        return {str(d): str(j) for d, j in db.all(_PROMISED)}

    return preempt.Preemption(running, promised, now, rules.min_runtime)


_ACTIVE = "state IN ('assigned', 'running')"
_RUNNING = (
    "SELECT id, device_id, device_ids, priority, started_at, preempted_by, worker_id, kind"
    f" FROM jobs WHERE {_ACTIVE} AND preemptible = 1"
)
#: The devices the last pass reserved for a job no preemptible job may take them from.
_PROMISED = (
    "SELECT reservations.device_id, reservations.job_id FROM reservations, jobs"
    " WHERE jobs.id = reservations.job_id AND jobs.state = 'queued' AND jobs.preemptible = 0"
)


def _stop(db: sql.Db, chosen: dict[str, str], chooser: preempt.Preemption) -> list[Preempted]:
    """Flag each victim for its worker, as a kill, unless it ended or another pass chose it."""
    stopped = []
    for victim, by in sorted(chosen.items()):
        if db.execute(
            "UPDATE jobs SET preempted_by = ?, kill_requested = 1, kill_delivered_at = 0"
            f" WHERE id = ? AND {_ACTIVE} AND preempted_by = ''",
            (by, victim),
        ).rowcount:
            stopped.append(Preempted(victim, chooser.worker(victim), by))
    return stopped


def held_by_share(db: sql.Db) -> dict[str, int]:
    """The devices each share name holds (kept by migration 0010's triggers)."""
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


_ROWS = "SELECT device_id, job_id FROM reservations"
_COUNT = "SELECT count(*) FROM reservations"


class KeptReservations:
    """The reservation rows as the last pass left them (reading thousands back was a tenth of a long
    pass); trusted only while no other connection wrote (SQLite), read every time on PostgreSQL."""

    def __init__(self) -> None:
        self._rows: dict[str, str] | None = None  #: None = read them next time
        self._version: int | None = None  #: ``data_version`` when they were kept

    def read(self, db: sql.Db) -> dict[str, str]:
        """The rows there now (device -> job); the caller must not change what it gets."""
        version = db.data_version()
        kept = self._rows
        unchanged = kept is not None and version is not None and version == self._version
        if kept is not None and unchanged and db.value(_COUNT) == len(kept):
            return kept
        rows = dict(db.all(_ROWS))
        self._rows, self._version = rows, version
        return rows

    def wrote(self, conn: sql.Db, rows: dict[str, str]) -> None:
        """The pass committed exactly ``rows``."""
        self._rows = rows
        self._version = conn.data_version()

    def forget(self) -> None:
        self._rows = None


@dataclasses.dataclass(frozen=True)
class _Settled:
    gen: int  #: the store's transaction count when the pass ended
    mark: int  #: the commit mark then
    end: PassEnd


class SettledQueue:
    """What the last pass left if it settled the queue, so a submit's pass that could change nothing
    is skipped; only while nothing else committed, never with aging."""

    def __init__(self) -> None:
        self._last: _Settled | None = None
        #: The job the last enqueue surely inserted (its commit surely wrote).
        self._inserted: str | None = None

    def forget(self) -> None:
        self._last = None

    def enqueued(self, job: JobRecord, keyed: bool) -> None:
        """A submit committed ``job`` (with a key, maybe an old job and nothing written)."""
        self._inserted = None if keyed else job.id

    def passed(self, db: sql.Db, gen: int, end: PassEnd, settled: bool) -> None:
        """A pass ended at transaction count ``gen``; ``settled``: nothing left to do."""
        mark = _commit_mark(db) if settled else None
        self._last = None if mark is None else _Settled(gen, mark, end)

    def skips(self, db: sql.Db, gen: int, job: JobRecord) -> bool:
        """Whether the pass after ``job``'s submit may be skipped, the queue staying settled."""
        s = self._last
        if s is None or gen != s.gen + 1 or not _behind(job, s.end):
            return False
        # SQLite's mark counts others' commits only; PostgreSQL's one per writer, the submit's too.
        own = 1 if db.postgres else 0
        if own and self._inserted != job.id:
            return False
        mark = _commit_mark(db)
        if mark is None or mark != s.mark + own:
            return False
        self._last = _Settled(gen, mark, s.end)
        return True


def _behind(job: JobRecord, end: PassEnd) -> bool:
    # A job waiting for others may be failed by this very pass.
    if not job.queued or end.last is None or job.after_ids:
        return False
    snap = job.snap()
    known = not snap.pinned or all(d in end.devices for d in snap.pins)
    return known and scheduling.queue_key(snap) > end.last


def _commit_mark(db: sql.Db) -> int | None:
    """A number that tells whether another process committed since it was read; None: unknown."""
    if not db.postgres:
        return db.data_version()
    # Inside a transaction (a report's pass) this connection's own is in progress.
    return None if db.in_transaction else db.quiet_mark()
