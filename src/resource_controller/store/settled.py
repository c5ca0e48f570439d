"""When the pass right after a submit would change nothing, so the store skips it.

A pass that placed nothing and ended with every device claimed leaves the queue
settled: a job submitted behind where its walk ended, pinned to no device it did not
see, can neither be placed nor reserve, so the pass after its submit would write
exactly what is there. That holds only while nothing else committed meanwhile: no
other transaction of this store (its transaction count), and no other process (a
commit mark: SQLite's ``data_version``, or PostgreSQL's transaction IDs,
``sql.Db.quiet_mark``). Not with priority aging on: ``now`` moves the order. A bursty
submitter otherwise pays a whole pass a submit behind a busy fleet.
"""

from __future__ import annotations

from dataclasses import dataclass

from resource_controller.core import scheduling
from resource_controller.store import sql
from resource_controller.store.passes import PassEnd
from resource_controller.store.records import JobRecord


@dataclass(frozen=True)
class _Settled:
    gen: int  #: the store's transaction count when the pass ended
    mark: int  #: the commit mark then
    end: PassEnd


class SettledQueue:
    """What the last pass left, if the queue was settled; used under the store's lock."""

    def __init__(self) -> None:
        self._last: _Settled | None = None
        #: The job the last enqueue surely inserted (its commit surely wrote).
        self._inserted: str | None = None

    def forget(self) -> None:
        self._last = None

    def enqueued(self, job: JobRecord, keyed: bool) -> None:
        """A submit committed ``job``; with an idempotency key it may have found an old
        job and written nothing."""
        self._inserted = None if keyed else job.id

    def passed(self, db: sql.Db, gen: int, end: PassEnd, settled: bool) -> None:
        """A pass ended at transaction count ``gen``; ``settled``: it placed nothing and
        claimed every device, with aging off."""
        mark = _commit_mark(db) if settled else None
        self._last = None if mark is None else _Settled(gen, mark, end)

    def skips(self, db: sql.Db, gen: int, job: JobRecord) -> bool:
        """Whether the pass after ``job``'s submit (the transaction ``gen``) may be
        skipped; if so the queue stays settled."""
        s = self._last
        if s is None or gen != s.gen + 1 or not _behind(job, s.end):
            return False
        # SQLite's mark counts other connections' commits only; PostgreSQL's moves by
        # one for each transaction that wrote, so by one for the submit's own.
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
    """A number that tells whether another process committed since it was read; None:
    unknown."""
    if not db.postgres:
        return db.data_version()
    # Inside a transaction (a report's pass) this connection's own is in progress.
    return None if db.in_transaction else db.quiet_mark()
