"""What workers take and tell (store.md §10-12): the hand-out, status reports and heartbeats, the
most frequent write, which asks for a pass only when it moved a device."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from resource_controller import errors
from resource_controller.core.states import ACTIVE, TERMINAL, DeviceState, JobState, Quarantine
from resource_controller.core.transitions import DEVICE, JOB, Op
from resource_controller.store import (
    after,
    attempts,
    leases,
    locks,
    moves,
    passes,
    queries,
    races,
    sql,
)
from resource_controller.store.base import Core
from resource_controller.store.jobs import Handed, Queue
from resource_controller.store.records import (
    NO_GPU_USE,
    Assigned,
    GpuUse,
    JobRecord,
    Kills,
    PassResult,
    split_ids,
)

log = logging.getLogger(__name__)

KILL_REDELIVERY = 30  #: seconds before an undelivered kill flag is offered again

_ACTIVE = tuple(str(s.value) for s in ACTIVE)
_IN_ACTIVE = "state IN (" + ", ".join(f"'{s}'" for s in _ACTIVE) + ")"
_HANDED = ", ".join(queries.JOB_COLS)
_FLAGGED = "jobs.worker_id = ? AND jobs.state = 'killed' AND jobs.kill_requested = 1"
#: A device behind a killed job whose kill is not yet final (its worker still names it),
#: by the job's device or by any lease of a several-device job.
_FLAGGED_KILLED = (
    f"EXISTS (SELECT 1 FROM jobs WHERE jobs.device_id = devices.id AND {_FLAGGED})"
    " OR EXISTS (SELECT 1 FROM leases, jobs WHERE leases.device_id = devices.id"
    f" AND leases.job_id = jobs.id AND {_FLAGGED})"
)


class Reports:
    """A worker's hand-out, status reports and heartbeats; a terminal report runs the pass of
    ``queue`` in its commit."""

    def __init__(self, core: Core, queue: Queue) -> None:
        self._core = core
        self._queue = queue

    @races.again
    def take_work(
        self, worker_id: str, have: Sequence[str] | None = None
    ) -> tuple[list[JobRecord], list[str]]:
        with self._core.tx("handout") as c:
            return take_work(c, self._core.now(), worker_id, have)

    @races.again
    def status(
        self,
        job_id: str,
        check: Callable[[JobRecord], None],
        state: str,
        exit_code: int | None = None,
        reason: str = "",
        gpu: GpuUse = NO_GPU_USE,
        hand_out: Callable[[str], bool] | None = None,
    ) -> tuple[JobRecord, PassResult | None]:
        """A worker's status report in one transaction, ``check`` first: a release and its pass
        commit together, so a device is handed on in the transaction that frees it; a failed pass
        undoes only itself. The job as it was before."""
        core = self._core
        if state == JobState.RUNNING:
            with core.tx("running") as c:
                job = queries.job(c, job_id)
                check(job)
                mark_running(c, core.now(), job_id)
            return job, None
        with core.lock:
            with core.tx("finish") as c:
                c.exclusive_until_commit(locks.SCHEDULING_PASS)
                job = queries.job(c, job_id)
                check(job)
                now = core.now()
                release_job(c, now, job, state, exit_code, reason, gpu)
                # The jobs waiting for this one are settled in the same commit, so the
                # pass places the next of a chain at once.
                ended = after.settle(c, now)
                placed: tuple[list[Assigned], passes.PassEnd, Handed] | None = None
                if job.device_id:
                    try:
                        with core.undone(c, savepoint="pass"):
                            assigned, end = passes.schedule_pass(c, core)
                            placed = assigned, end, self._hand_out(c, assigned, hand_out)
                    except Exception:
                        log.exception("scheduling pass after the report of job %s failed", job_id)
            if placed is None:
                self._queue.noted_ended(ended)
                return job, None
            assigned, end, handed = placed
            return job, self._queue.passed(assigned, end, ended, handed)

    def _hand_out(
        self, c: sql.Db, assigned: list[Assigned], hand_out: Callable[[str], bool] | None
    ) -> Handed:
        if hand_out is None:
            return {}
        workers = dict.fromkeys(a.worker_id for a in assigned)
        now = self._core.now()
        return {w: take_work(c, now, w) for w in workers if hand_out(w)}

    @races.again
    def heartbeat(
        self,
        worker_id: str,
        running: Sequence[str],
        retain: bool = False,
        pending: Sequence[str] | None = None,
    ) -> bool:
        """STORE-096: renew the named (and ``pending``: reported but not landed) jobs' leases and
        restore their devices; True when it moved a device."""
        with self._core.tx("heartbeat") as db:
            return _heartbeat(db, self._core.now(), worker_id, [*running, *(pending or [])], retain)


def take_work(
    conn: sql.Db, now: int, worker_id: str, have: Sequence[str] | None = None
) -> tuple[list[JobRecord], Kills]:
    """Hand out this worker's assigned jobs, now ``running``, and its due kill flags. Each job
    moves to ``running`` in the one poll whose update moved it, so no poll starts a job twice.
    ``have`` names every job the worker runs or still reports on: its ``running`` jobs outside
    it went to a poll whose answer was lost, and are handed out again (a worker starts a job
    at most once)."""
    rows = moves.move_returning(
        conn,
        JOB,
        Op.MARK_RUNNING,
        "worker_id = ?",
        (worker_id,),
        _HANDED,
        state=JobState.RUNNING,
        started_at=now,
    )
    handed = list(map(queries.job_record, rows))
    if have is not None:
        known = {*have, *(j.id for j in handed)}
        running = conn.all(
            f"SELECT {_HANDED} FROM jobs WHERE worker_id = ? AND state = ?",
            (worker_id, JobState.RUNNING),
        )
        for job in map(queries.job_record, running):
            if job.id not in known:
                log.warning("job %s handed to worker %s again: it never had it", job.id, worker_id)
                handed.append(job)
    handed.sort(key=lambda job: (job.submitted_at, job.seq))
    if handed:
        epochs = dict(
            conn.all(
                f"SELECT job_id, max(epoch) FROM leases WHERE job_id IN ({sql.marks(len(handed))})"
                " GROUP BY job_id",
                [j.id for j in handed],
            )
        )
        handed = [j._replace(lease_epoch=int(epochs.get(j.id) or 0)) for j in handed]
    states = (*_ACTIVE, JobState.KILLED)
    flagged = conn.all(
        "SELECT id, preempted_by, preempt_grace_seconds FROM jobs WHERE worker_id = ?"
        f" AND kill_requested = 1 AND state IN ({sql.marks(len(states))})"
        " AND kill_delivered_at <= ?",
        (worker_id, *states, now - KILL_REDELIVERY),
    )
    due = Kills(
        (str(job_id) for job_id, _, _ in flagged),
        {str(job_id): int(own) for job_id, by, own in flagged if by},
    )
    if due:
        conn.execute(
            f"UPDATE jobs SET kill_delivered_at = ? WHERE {queries.id_in(len(due))}", (now, *due)
        )
    return handed, due


def mark_running(conn: sql.Db, now: int, job_id: str) -> None:
    moves.move(
        conn, JOB, Op.MARK_RUNNING, "id = ?", (job_id,), state=JobState.RUNNING, started_at=now
    )


def release_job(
    conn: sql.Db,
    now: int,
    job: JobRecord,
    state: str,
    exit_code: int | None,
    reason: str,
    gpu: GpuUse = NO_GPU_USE,
) -> None:
    """The worker's terminal report (STORE-082): end the attempt (the job, unless it queues
    again), free its busy devices, release its leases; a terminal job is left as it is."""
    if state not in TERMINAL:
        raise errors.InvalidTransition(f"state {state!r} is not terminal")
    if job.terminal:
        return
    if not job.active:
        raise errors.InvalidTransition(
            f"job {job.id} is {job.state}; only an active job can be released"
        )
    measured = {"gpu_util_mean": gpu.util_mean, "gpu_mem_peak_bytes": gpu.mem_peak_bytes}
    measured |= {"gpu_samples": gpu.samples, "exit_code": exit_code}
    if attempts.end(conn, Op.RELEASE, job, state, reason, now, **measured) is None:
        raise errors.StoreError(f"job {job.id} changed state under a serialised release")
    # The devices first, then the leases: a grant flips its device before it inserts
    # the lease, and both orders alike keep two controllers' grant and release from
    # waiting on each other's rows (the device counter, the submitter's held count).
    freed = queries.live_lease_devices(conn, job.id)
    if freed:
        # Only a busy device returns: an unhealthy one (faulted by verify) stays out,
        # an unknown one waits for its worker's next heartbeat.
        moves.move(
            conn, DEVICE, Op.RELEASE, queries.id_in(len(freed)), freed, state=DeviceState.READY
        )
    leases.release_for_job(conn, now, job.id, util=gpu.util_mean)


def _heartbeat(db: sql.Db, now: int, worker_id: str, named: list[str], retain: bool) -> bool:
    """STORE-096's steps, in its order, for the jobs ``named`` (running or pending)."""
    if not db.execute(
        "UPDATE workers SET last_heartbeat_at = ? WHERE id = ?", (now, worker_id)
    ).rowcount:
        return False
    mine_ids: list[str] = []
    devices: set[str] = set()
    if named:
        rows = db.all(
            f"SELECT id, device_id, device_ids FROM jobs WHERE {queries.id_in(len(named))}"
            f" AND worker_id = ? AND {_IN_ACTIVE}",
            (*named, worker_id),
        )
        for job_id, device_id, device_ids in rows:
            mine_ids.append(job_id)
            devices.update(
                split_ids(device_ids) if device_ids else ([device_id] if device_id else [])
            )
    mine_devices = sorted(devices)
    moved = 0
    if mine_ids:
        db.execute(
            f"UPDATE leases SET expires_at = ? WHERE job_id IN ({sql.marks(len(mine_ids))})"
            " AND released_at IS NULL",
            (now + leases.RENEWAL, *mine_ids),
        )
        if mine_devices:
            where = (
                f"worker_id = ? AND {queries.id_in(len(mine_devices))} AND quarantine_reason = ?"
            )
            params = (worker_id, *mine_devices, str(Quarantine.WORKER_LOST))
            busy = DeviceState.BUSY
            moved += moves.set_devices(
                db, Op.HEARTBEAT_RESTORE, where, params, busy, last_heartbeat_at=now
            )
    # A killed job's flag stops once its worker no longer names it: the process is gone.
    unflag = (
        "UPDATE jobs SET kill_requested = 0 WHERE worker_id = ? AND state = ?"
        " AND kill_requested = 1"
    )
    if named:
        unflag += f" AND id NOT IN ({sql.marks(len(named))})"
    db.execute(unflag, (worker_id, str(JobState.KILLED), *named))
    if not retain or mine_devices:
        where, ids = f"worker_id = ? AND {queries.LEASED}", mine_devices if retain else []
        if retain:
            where += f" AND {queries.id_in(len(ids))}"
        busy = DeviceState.BUSY
        moved += moves.move(db, DEVICE, Op.HEARTBEAT_BUSY, where, [worker_id, *ids], state=busy)
    moved += moves.move(
        db,
        DEVICE,
        Op.HEARTBEAT_READY,
        f"worker_id = ? AND NOT {queries.LEASED} AND NOT ({_FLAGGED_KILLED})",
        (worker_id, worker_id, worker_id),
        state=DeviceState.READY,
    )
    db.execute("UPDATE devices SET last_heartbeat_at = ? WHERE worker_id = ?", (now, worker_id))
    return moved > 0
