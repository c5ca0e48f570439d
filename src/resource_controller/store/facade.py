"""``Store``: the one door to the database.

Owns the engine, the clock and a process-wide lock. Every public method is one
transaction taken under that lock, so within one controller process
store operations are serialised (one writer at a time), and reads ``now`` from the
clock exactly once. The domain modules (``jobs``, ``leases``, ``devices``,
``views``) hold the SQL; this class only opens transactions and passes ``now``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path

from resource_controller import crashpoints, errors
from resource_controller.clock import Clock
from resource_controller.core import expiry, scheduling, share
from resource_controller.core import usage as acct
from resource_controller.core.states import TERMINAL, JobState
from resource_controller.core.waiting import Blocker
from resource_controller.store import (
    after,
    beat,
    devices,
    engine,
    fleet,
    jobs,
    leadership,
    locks,
    passes,
    queries,
    races,
    reserved,
    settled,
    sql,
    sweep,
    views,
)
from resource_controller.store import usage as rollup
from resource_controller.store.records import (
    NO_GPU_USE,
    Assigned,
    AutoRecovery,
    DeviceSnapshot,
    GpuUse,
    JobRecord,
    PassResult,
    Registration,
    SweepResult,
)

log = logging.getLogger(__name__)

#: Work a report's commit handed out, by worker: (jobs now ``running``, kills).
Handed = dict[str, tuple[list[JobRecord], list[str]]]


class _Serial:
    """The store's lock (re-entrant), which also knows when an operation starts: at the
    first use of the connection under its outermost hold."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0
        self._fresh = False

    def __enter__(self) -> None:
        self._lock.acquire()
        self._depth += 1
        self._fresh = self._fresh or self._depth == 1

    def __exit__(self, *_: object) -> None:
        self._depth -= 1
        self._lock.release()

    def starting(self) -> bool:
        """True at the first call under each outermost hold, False after."""
        fresh, self._fresh = self._fresh, False
        return fresh


class Store:
    """The controller's state, behind serialised transactions."""

    def __init__(self, database: Path | str, clock: Clock, priority_aging: int = 0) -> None:
        """``database``: a SQLite file's path, or a ``postgresql://`` URL."""
        self.clock = clock
        #: Seconds of waiting per step of effective priority; 0 = off.
        self.aging = max(0, int(priority_aging))
        self.database = engine.Database.at(database)
        driver = engine.open_driver(self.database)
        try:
            engine.migrate(self.database, driver)
        except BaseException:
            driver.close()
            raise
        #: The PostgreSQL database as a libpq URL, for the controllers' own connections;
        #: None on SQLite.
        self.database_url = self.database.libpq_url
        self._db = sql.Db(driver, self.database.dialect)
        self._lock = _Serial()
        self._closed = False
        #: Transactions this store has run (each may have written), for ``schedule_after``.
        self._gen = 0
        #: What the last pass left, for skipping the pass after a submit.
        self._settled = settled.SettledQueue()
        #: The devices as the pass reads them, reread only where they changed.
        self._fleet = fleet.FleetSnapshot()
        #: The reservation rows the last pass left, kept so the next need not read them.
        self._reserved = reserved.KeptReservations()
        #: The submitter limits; the controller sets them, and sets them
        #: again when the limits file is read again.
        self.limits = share.NO_LIMITS
        #: Waiting jobs a report's transaction ended ``dependency_failed``
        #: since a pass last said which: the pass that follows the report says so.
        self._ended: list[str] = []

    def _key(self, now: int) -> scheduling.QueueKey:
        """The queue order at ``now``: aged when ``--priority-aging`` is on."""
        return scheduling.aged_queue_key(now, self.aging)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._db.driver.close()

    def now(self) -> int:
        """Whole Unix seconds, truncated."""
        return int(self.clock.now())

    def _usable(self) -> sql.Db:
        """The connection for an operation. At its start (the first use under the lock's
        outermost hold), one the server dropped while it stood idle (a restart, an
        administrator, an idle limit) is replaced first, and what was cached from it is
        read afresh: the operation never sees it. Later in an operation a dropped one
        ends it (``ConnectionDropped``), since what ran before may rest on the old
        session (the pass's session lock); ``races.again`` runs it once more.
        ``StoreUnavailable`` while the database cannot be reached."""
        starting = self._lock.starting()
        if not self._db.broken and not (starting and engine.dropped(self._db.driver)):
            return self._db
        if self._closed:
            raise errors.StoreError("the store is closed")
        if not starting:
            raise errors.ConnectionDropped("the database connection dropped")
        with suppress(Exception):  # already gone with the server
            self._db.driver.close()
        try:
            driver = engine.open_driver(self.database)
        except Exception as exc:
            raise errors.StoreUnavailable("the database cannot be reached") from exc
        self._db = sql.Db(driver, self.database.dialect)
        self._fleet.forget()
        self._reserved.forget()
        self._settled.forget()
        return self._db

    def _failed(self, exc: BaseException) -> errors.StoreError:
        """The error a driver failure becomes: ``ConnectionDropped`` when the connection
        went with it (nothing committed: the operation may run again)."""
        if self._db.broken:
            return errors.ConnectionDropped("the database connection dropped")
        return errors.StoreError(f"database error: {type(exc).__name__}")

    @contextmanager
    def _tx(self, point: str = "") -> Iterator[sql.Db]:
        """One transaction under the lock; ``point`` names its crash point (a test hook).
        A driver error becomes ``StoreError`` naming only its type. A connection lost
        before the commit wrote nothing (``ConnectionDropped``); one lost at the commit
        leaves it unknown whether it committed (``StoreUnavailable``, never run again)."""
        with self._lock:
            self._gen += 1
            db = self._usable()
            committing = False
            try:
                db.begin()
                try:
                    with self._undone(db):
                        yield db
                        crashpoints.hit(point, ".before_commit")
                        if db.broken:  # a failure the operation went on past: no commit
                            raise errors.ConnectionDropped("the database connection dropped")
                        committing = True
                        db.commit()
                except BaseException:
                    if not db.broken:  # else the transaction went with the connection
                        db.rollback()
                    raise
                crashpoints.hit(point, ".after_commit")
            except errors.RcError:
                raise
            except db.errors as exc:
                if committing and db.broken:
                    raise errors.StoreUnavailable(
                        "the database connection dropped at a commit: whether it committed"
                        " is unknown"
                    ) from exc
                raise self._failed(exc) from exc

    @contextmanager
    def _undone(self, db: sql.Db, savepoint: str = "") -> Iterator[None]:
        """A transaction, or with ``savepoint`` a part of one: if it fails, what the
        caches took from it is dropped (it may never have been committed)."""
        seen = self._fleet.seen
        try:
            if savepoint:
                with db.savepoint(savepoint):
                    yield
            else:
                yield
        except BaseException:
            self._fleet.rolled_back(seen)
            self._reserved.forget()
            self._settled.forget()
            raise

    @contextmanager
    def _read(self) -> Iterator[sql.Db]:
        """Reads on the driver's connection under the lock, outside any transaction: each
        statement sees the last commit, and the lock keeps every writer out meanwhile."""
        with self._lock:
            db = self._usable()
            try:
                yield db
            except db.errors as exc:
                raise self._failed(exc) from exc

    # ---- queue -----------------------------------------------------------------------

    @races.again
    def enqueue(self, req: jobs.NewJob) -> JobRecord:
        def once() -> JobRecord:
            with self._tx("submit") as c:
                job = jobs.enqueue(c, self.now(), req, lambda: self._fleet.read(c)[1])
            self._settled.enqueued(job, keyed=bool(req.idempotency_key))
            return job

        try:
            return once()
        except errors.StoreError as exc:
            # Another controller inserted the same idempotency key meanwhile (its row was
            # not there to see): the key's job is the answer, as if it had been.
            lost_race = exc.__cause__ is not None and sql.row_error(exc.__cause__)
            if not (req.idempotency_key and lost_race):
                raise
        return once()

    def schedule(self) -> list[Assigned]:
        """One scheduling pass; the jobs it placed."""
        return self.run_pass().assigned

    @races.again
    def run_pass(self) -> PassResult:
        """One scheduling pass, serialised against every other (``locks.SCHEDULING_PASS``,
        held to its commit): first the ends of jobs others wait for, then the placements,
        all in one transaction."""
        with self._lock:
            with self._tx() as c:
                c.exclusive_until_commit(locks.SCHEDULING_PASS)
                ended = after.settle(c, self.now()) if after.noted(c) else []
                assigned, end = self._placements(c)
            return self._passed(assigned, end, ended)

    def _placements(self, c: sql.Db) -> tuple[list[Assigned], passes.PassEnd]:
        """The placing part of a pass in the open transaction ``c``, each placement a
        savepoint of it."""
        end = passes.PassEnd()
        assigned = passes.schedule_pass(
            c, self.now(), self.aging, end, self._fleet, self._reserved, self.limits
        )
        return assigned, end

    def _passed(
        self,
        assigned: list[Assigned],
        end: passes.PassEnd,
        ended: list[str],
        handed: Handed | None = None,
    ) -> PassResult:
        """A pass committed: note whether it left the queue settled, and what it did."""
        if assigned:
            crashpoints.hit("grant", ".after_commit")
        quiet = self.aging <= 0 and end.saturated and not assigned
        self._settled.passed(self._db, self._gen, end, quiet)
        return PassResult(assigned, self._take_ended() + ended, handed or {})

    @races.reconnecting
    def schedule_after(self, job: JobRecord) -> PassResult:
        """The pass right after ``job``'s enqueue, skipped when it cannot change
        anything (``store/settled.py``)."""
        with self._lock:
            if self._settled.skips(self._db, self._gen, job):
                return PassResult()
            return self.run_pass()

    @races.reconnecting
    def job(self, job_id: str) -> JobRecord:
        with self._read() as c:
            return queries.job(c, job_id)

    @races.reconnecting
    def job_view(self, job_id: str) -> tuple[JobRecord, int, list[Blocker] | None]:
        """The job, its queue position and what it waits for, in one transaction
        ; ``None`` for a job that is not queued."""
        with self._tx() as c:
            job = queries.job(c, job_id)
            if not job.queued:
                return job, 0, None
            now = self.now()
            return (
                job,
                jobs.queue_position(c, job, now, self.aging),
                views.waiting_for(c, job, self._key(now), self._fleet, self.limits),
            )

    @races.reconnecting
    def waiting_for(self, job: JobRecord) -> list[Blocker]:
        """What a queued job waits for now; ``[]`` once it left the queue."""
        with self._tx() as c:
            return views.waiting_for(c, job, self._key(self.now()), self._fleet, self.limits)

    @races.reconnecting
    def held_by_share(self) -> dict[str, int]:
        """The devices each share name holds now (EXT-SHARE-1, ``/metrics``)."""
        with self._read() as c:
            return passes.held_by_share(c)

    @races.reconnecting
    def list_jobs(
        self,
        limit: int = 20,
        device: str = "",
        submitter: str = "",
        state: str = "",
        id_prefix: str = "",
        before: str = "",
    ) -> list[JobRecord]:
        with self._read() as db:
            return jobs.list_jobs(db, limit, device, submitter, state, id_prefix, before)

    @races.reconnecting
    def ping(self) -> None:
        """One cheap read; raises when the store cannot answer."""
        with self._read() as c:
            c.value("SELECT 1")

    @races.reconnecting
    def metric_counts(
        self,
    ) -> tuple[dict[str, int], dict[str, int], dict[str, int], dict[str, int]]:
        """Devices by state, jobs by state, each worker host's last heartbeat
        , the devices each submitter holds."""
        with self._tx() as c:
            devs = c.all("SELECT state, count(*) FROM devices GROUP BY state")
            jbs = c.all("SELECT state, count(*) FROM jobs GROUP BY state")
            beats = c.all("SELECT host, max(last_heartbeat_at) FROM workers GROUP BY host")
            held = passes.held_by_share(c)
        return (
            {str(s): int(n) for s, n in devs},
            {str(s): int(n) for s, n in jbs},
            {str(h): int(t) for h, t in beats},
            held,
        )

    @races.reconnecting
    def queued_jobs(self) -> list[JobRecord]:
        with self._tx() as c:
            return jobs.queued(c, self.now(), self.aging)

    @races.reconnecting
    def active_jobs(self) -> list[JobRecord]:
        with self._tx() as c:
            return jobs.active(c)

    @races.again
    def cancel_queued(self, job_id: str, reason: str) -> bool:
        with self._tx() as c:
            return jobs.cancel_queued(c, self.now(), job_id, reason)

    @races.again
    def request_kill(
        self, job_id: str, reason: str, finalize_disconnected: bool = False
    ) -> jobs.KillRequest:
        with self._tx("kill") as c:
            return jobs.request_kill(c, self.now(), job_id, reason, finalize_disconnected)

    @races.again
    def take_work(self, worker_id: str) -> tuple[list[JobRecord], list[str]]:
        with self._tx("handout") as c:
            return jobs.take_work(c, self.now(), worker_id)

    @races.again
    def report(
        self,
        job_id: str,
        check: Callable[[JobRecord], None],
        state: str,
        exit_code: int | None = None,
        reason: str = "",
        gpu: GpuUse = NO_GPU_USE,
    ) -> JobRecord:
        """A worker's status report in one transaction: read the job, let ``check`` refuse
        it (raising writes nothing), then ``running`` or the release
        with what the job's GPUs did. Returns the job as it was
        before the report."""
        with self._tx("running" if state == JobState.RUNNING else "finish") as c:
            job, ended = self._report_in(c, job_id, check, state, exit_code, reason, gpu)
        self._ended += ended
        return job

    @races.again
    def report_and_pass(
        self,
        job_id: str,
        check: Callable[[JobRecord], None],
        state: str,
        exit_code: int | None = None,
        reason: str = "",
        gpu: GpuUse = NO_GPU_USE,
        hand_out: Callable[[str], bool] | None = None,
    ) -> tuple[JobRecord, PassResult | None]:
        """``report``, and for a terminal one that freed devices the pass it calls for
        , in ONE commit: the device is handed on in the transaction that
         frees it, one durable commit instead of two. Each placement is a savepoint, so a
         lost race undoes only itself; a pass that fails undoes only the pass (logged,
         None), and the report commits alone for the scheduler loop to place after.

         ``hand_out(worker_id)`` says whether a long poll of that worker waits for work
         and is now promised this commit's answer: for each such worker the pass placed
         on, the hand-out (``take_work``) joins the commit too, in ``PassResult.handed``.
        """
        if state == JobState.RUNNING:
            return self.report(job_id, check, state, exit_code, reason, gpu), None
        with self._lock:
            with self._tx("finish") as c:
                c.exclusive_until_commit(locks.SCHEDULING_PASS)
                job, ended = self._report_in(c, job_id, check, state, exit_code, reason, gpu)
                placed: tuple[list[Assigned], passes.PassEnd, Handed] | None = None
                if job.device_id:
                    try:
                        with self._undone(c, savepoint="pass"):
                            assigned, end = self._placements(c)
                            placed = assigned, end, self._hand_out(c, assigned, hand_out)
                    except Exception:
                        log.exception("scheduling pass after the report of job %s failed", job_id)
            if placed is None:
                self._ended += ended
                return job, None
            return job, self._passed(*placed[:2], ended, placed[2])

    def _hand_out(
        self, c: sql.Db, assigned: list[Assigned], hand_out: Callable[[str], bool] | None
    ) -> Handed:
        """The hand-out of each worker placed on whose waiting poll ``hand_out`` claims."""
        if hand_out is None:
            return {}
        workers = dict.fromkeys(a.worker_id for a in assigned)
        now = self.now()
        return {w: jobs.take_work(c, now, w) for w in workers if hand_out(w)}

    def _take_ended(self) -> list[str]:
        ended, self._ended = self._ended, []
        return ended

    def _report_in(
        self,
        c: sql.Db,
        job_id: str,
        check: Callable[[JobRecord], None],
        state: str,
        exit_code: int | None,
        reason: str,
        gpu: GpuUse,
    ) -> tuple[JobRecord, list[str]]:
        """A status report's writes in the open transaction: the job as it was before,
        and the waiting jobs its end settled."""
        now = self.now()
        job = queries.job(c, job_id)
        check(job)
        if state == JobState.RUNNING:
            jobs.mark_running(c, now, job_id)
            return job, []
        if state not in TERMINAL:
            raise errors.InvalidTransition(f"state {state!r} is not terminal")
        jobs.release_job(c, now, job, state, exit_code, reason, gpu)
        # The jobs waiting for this one are settled in the same commit,
        # so the pass places the next of a chain at once.
        return job, after.settle(c, now)

    @races.reconnecting
    def usage(self, by: str, since: int, limit: int = acct.MAX_GROUPS) -> acct.Window:
        """Who held what over the last ``since`` seconds, by ``by``: the
        rollup's two rows per group, in one statement."""
        acct.check_by(by)
        with self._read() as c:
            now = self.now()
            first = acct.window_start(now, since)
            groups = rollup.window(c, by, first)
        return acct.summarise(by, first * acct.HOUR, now, groups, limit)

    @races.reconnecting
    def usage_pairs(self, within: int) -> list[rollup.PairTotals]:
        """Device-and-submitter totals of the pairs active in the last ``within``
        seconds, for ``/metrics``."""
        with self._read() as c:
            return rollup.recent_pairs(c, acct.window_start(self.now(), within))

    @races.reconnecting
    def logs_to_prune(
        self, retention: int, limit: int, fence: leadership.Fence | None = None
    ) -> list[str]:
        """Jobs ended more than ``retention`` seconds ago with output still stored, for
        the leader of ``fence`` only (``NotLeading`` else)."""
        with self._tx() as c:
            leadership.hold(c, fence)
            return jobs.logs_to_prune(c, self.now() - retention, limit)

    @races.again
    def mark_logs_pruned(self, job_ids: list[str], fence: leadership.Fence | None = None) -> None:
        with self._tx() as c:
            leadership.hold(c, fence)
            jobs.mark_logs_pruned(c, job_ids)

    # ---- workers and devices ---------------------------------------------------------

    @races.again
    def register(self, host: str, boot_id: str, declared: list[tuple[str, int]]) -> Registration:
        with self._tx("register") as c:
            return devices.register(c, self.now(), host, boot_id, declared)

    @races.again
    def heartbeat(
        self,
        worker_id: str,
        running: list[str],
        retain: bool = False,
        pending: list[str] | None = None,
    ) -> bool:
        """STORE-096; ``pending`` counts as named in every step. True when
        a device changed state."""
        with self._tx("heartbeat") as c:
            return beat.heartbeat(c, self.now(), worker_id, running, retain, pending)

    @races.again
    def auto_recover(self, worker_id: str, proof: expiry.Proof | None) -> AutoRecovery:
        """Lift this worker's recoverable quarantines on a valid proof, flap guard permitting."""
        with self._tx() as c:
            return devices.auto_recover(c, self.now(), worker_id, proof)

    # ---- the reaper -------------------------------------------------------------------

    @races.again
    def sweep(self, rules: expiry.SweepRules, fence: leadership.Fence | None = None) -> SweepResult:
        """One sweep: demote the silent, reap, expire; never frees a device. Made only by
        the leader of ``fence`` (``NotLeading`` else, nothing written); None: the one
        controller of a SQLite store."""
        with self._tx("sweep") as c:
            leadership.hold(c, fence)
            return sweep.sweep(c, self.now(), rules)

    @races.reconnecting
    def quarantine_reasons(self, ids: list[str]) -> dict[str, str]:
        """Post-sweep read."""
        with self._tx() as c:
            return views.quarantine_column(c, ids, "quarantine_reason")

    @races.reconnecting
    def lease_devices(self, ids: list[str]) -> dict[str, str]:
        """Post-sweep read: lease or job ID -> device."""
        with self._tx() as c:
            return views.lease_devices(c, ids)

    @races.reconnecting
    def worker_host(self, worker_id: str) -> str:
        with self._tx() as c:
            return devices.worker_host(c, worker_id)

    @races.again
    def apply_facts(
        self,
        host: str,
        names: list[str],
        labels: Mapping[str, Mapping[str, str]] | None,
        declared: Mapping[str, Mapping[str, str]] | None,
        sheet: str | None,
        device_sheets: Mapping[str, str] | None,
    ) -> None:
        with self._tx() as c:
            devices.apply_facts(c, self.now(), host, names, labels, declared, sheet, device_sheets)

    @races.reconnecting
    def device_snapshots(self, device_id: str | None = None) -> list[DeviceSnapshot]:
        with self._tx() as c:
            return views.devices(c, device_id, kept=self._fleet)

    @races.again
    def clear_device(self, device_id: str) -> bool:
        with self._tx() as c:
            return devices.clear(c, device_id)

    @races.again
    def set_device_state(self, device_id: str, state: str, detail: str = "") -> None:
        with self._tx() as c:
            devices.set_state(c, self.now(), device_id, state, detail)

    @races.again
    def drain_device(self, device_id: str, by: str, reason: str) -> None:
        """EXT-DRAIN-2; ``DeviceNotFound`` for an unknown device."""
        with self._tx() as c:
            devices.drain(c, self.now(), device_id, by, reason)

    @races.again
    def undrain_device(self, device_id: str) -> None:
        with self._tx() as c:
            devices.undrain(c, device_id)

    @races.again
    def retire_device(self, device_id: str) -> None:
        with self._tx() as c:
            devices.retire(c, device_id)

    @races.reconnecting
    def explain(self, selector: str) -> views.Explanation:
        with self._tx() as c:
            return views.explain(c, selector, self._fleet)

    @races.reconnecting
    def describe(self, device_id: str) -> views.Description | None:
        """Everything describe shows, read in one transaction."""
        with self._tx() as c:
            snaps = views.devices(c, device_id)
            if not snaps:
                return None
            return views.Description(
                snapshot=snaps[0],
                sheet=views.sheet_for(c, snaps[0].device),
                recent_jobs=views.recent_jobs(c, device_id),
                recoveries=devices.recovery_history(c, self.now(), device_id),
            )

    @races.reconnecting
    def active_job_on(self, device_id: str) -> str:
        with self._tx() as c:
            return views.active_job_on(c, device_id)

    @races.reconnecting
    def state_view(
        self,
    ) -> tuple[list[DeviceSnapshot], list[JobRecord], list[JobRecord], dict[str, list[Blocker]]]:
        """Devices, active jobs, the queue and what each queued job waits for, in one
        transaction: one gathering for the whole queue, not a read
        per job."""
        with self._tx() as c:
            now = self.now()
            queued = jobs.queued(c, now, self.aging)
            waits = views.waiting_for_all(c, queued, self._key(now), self._fleet, self.limits)
            active = jobs.active(c)
            held = views.devices(c, commands={j.id: j.command for j in active}, kept=self._fleet)
            return held, active, queued, waits
