"""The queue and the pass (store.md §7-9, §11); only the pass places, so nothing jumps the queue."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from resource_controller import crashpoints, errors
from resource_controller.core import scheduling, selectors, waiting
from resource_controller.core.scheduling import DeviceSnap, JobSnap
from resource_controller.core.states import DeviceState, JobState, Kind, Quarantine, RetryOn
from resource_controller.core.transitions import JOB, Op
from resource_controller.store import after, leases, locks, moves, passes, queries, races, sql
from resource_controller.store.base import Core
from resource_controller.store.records import Assigned, JobRecord, PassResult

log = logging.getLogger(__name__)

#: A plain string: compared once per device (an enum member costs four times as much).
_UNHEALTHY = DeviceState.UNHEALTHY.value
#: Work a report's commit handed out, by worker: (jobs now ``running``, kills).
Handed = dict[str, tuple[list[JobRecord], list[str]]]


@dataclass(frozen=True)
class NewJob:
    """A submit as ``controller/submits.py`` admitted it (pins sorted, ``after`` once each)."""

    command: list[str]
    submitter: str
    device_id: str = ""
    selector: str = ""
    cwd: str = ""
    env: dict[str, str] | None = None
    idempotency_key: str = ""
    priority: int = 0
    max_runtime_seconds: float = 0
    idle_timeout: float = 0
    kind: str = Kind.JOB
    reason: str = ""
    stdio: str = ""
    #: Devices wanted on one host; ``device_ids`` pins to a list of them.
    count: int = 1
    device_ids: tuple[str, ...] = ()
    #: The name the submitter limit counts it under; '' = ``submitter``.
    share_name: str = ""
    #: Jobs it waits for, and whether any end will do or only ``succeeded``.
    after: tuple[str, ...] = ()
    after_any: bool = False
    retries: int = 0
    retry_on: str = RetryOn.LOST
    preemptible: bool = False
    no_requeue: bool = False
    preempt_grace_seconds: int = 0


class KillOutcome(StrEnum):
    """What asking to kill an active job did."""

    #: Flagged for its worker, which stops the process and reports.
    REQUESTED = "requested"
    #: Its worker is gone: ended here, its devices kept out.
    FINALIZED = "finalized"
    #: It had already ended.
    NOT_CANCELLABLE = "not_cancellable"


class Queue:
    """The queue's operations, each in the core's one transaction context."""

    def __init__(self, core: Core) -> None:
        self._core = core
        #: Waiting jobs a report ended ``dependency_failed``: the next pass says so.
        self._ended: list[str] = []

    @races.again
    def enqueue(self, req: NewJob) -> JobRecord:
        """STORE-056: record a job ``queued``, or return the job that has its key."""
        core = self._core

        def once() -> JobRecord:
            with core.tx("submit") as c:
                job = enqueue(c, core.now(), req, lambda: core.fleet.read(c)[1])
            core.settled.enqueued(job, keyed=bool(req.idempotency_key))
            return job

        try:
            return once()
        except errors.StoreError as exc:
            # Another controller inserted the same key meanwhile: the key's job is the answer.
            lost_race = exc.__cause__ is not None and sql.row_error(exc.__cause__)
            if not (req.idempotency_key and lost_race):
                raise
        return once()

    @races.again
    def cancel(self, job_id: str, reason: str) -> bool:
        """STORE-090: queued -> killed; False (nothing changed) for any other state."""
        with self._core.tx() as c:
            done = moves.end_job(
                c, Op.CANCEL_QUEUED, job_id, JobState.KILLED, reason, self._core.now()
            )
            if done == 1:
                c.execute("DELETE FROM reservations WHERE job_id = ?", (job_id,))
            return done == 1

    @races.again
    def request_kill(
        self, job_id: str, reason: str, finalize_disconnected: bool = False
    ) -> KillOutcome:
        """STORE-091..093: flag an active job for its worker, or end it here when the worker is
        gone."""
        with self._core.tx("kill") as c:
            job = queries.job(c, job_id)
            if not job.active:
                return KillOutcome.NOT_CANCELLABLE
            if finalize_disconnected and _disconnected(c, job):
                now = self._core.now()
                flag = {"kill_requested": 1, "kill_delivered_at": 0}
                moves.end_job(c, Op.KILL_FINALIZE, job_id, JobState.KILLED, reason, now, **flag)
                # The device stays out: nothing proves it is empty.
                leases.release_for_job(c, now, job_id)
                return KillOutcome.FINALIZED
            # A person's kill wins over a preemption under way: the job ends, never queued again.
            c.execute(
                "UPDATE jobs SET kill_requested = 1, kill_delivered_at = 0, preempted_by = ''"
                " WHERE id = ?",
                (job_id,),
            )
            return KillOutcome.REQUESTED

    @races.again
    def run_pass(self) -> PassResult:
        """One scheduling pass under ``locks.SCHEDULING_PASS`` to its commit: the ends of
        jobs others wait for, then the placements, in one transaction."""
        core = self._core
        with core.lock:
            with core.tx() as c:
                c.exclusive_until_commit(locks.SCHEDULING_PASS)
                ended = after.settle(c, core.now()) if after.noted(c) else []
                assigned, end = passes.schedule_pass(c, core)
            return self.passed(assigned, end, ended)

    def passed(
        self,
        assigned: list[Assigned],
        end: passes.PassEnd,
        ended: list[str],
        handed: Handed | None = None,
    ) -> PassResult:
        """A pass committed: note whether it left the queue settled, and what it did."""
        core = self._core
        if assigned:
            crashpoints.hit("grant", ".after_commit")
        quiet = core.aging <= 0 and end.saturated and not assigned and not end.stoppable
        core.settled.passed(core.db, core.gen, end, quiet and not end.preempted)
        ended, self._ended = self._ended + ended, []
        return PassResult(assigned, ended, handed or {}, end.preempted)

    def noted_ended(self, ended: list[str]) -> None:
        """A report ended these waiting jobs: the next pass says so."""
        self._ended += ended

    @races.reconnecting
    def schedule_after(self, job: JobRecord) -> PassResult:
        """The pass right after ``job``'s enqueue, skipped when it cannot change anything."""
        core = self._core
        with core.lock:
            if core.settled.skips(core.db, core.gen, job):
                return PassResult()
            return self.run_pass()

    @races.reconnecting
    def job_view(self, job_id: str) -> tuple[JobRecord, int, list[waiting.Blocker] | None]:
        """The job, its queue position (STORE-070) and what it waits for; 0, None if not queued."""
        core = self._core
        with core.tx() as c:
            job = queries.job(c, job_id)
            if not job.queued:
                return job, 0, None
            now = core.now()
            return job, _position(c, job, now, core.aging), waiting_for(c, core, job, now)

    @races.reconnecting
    def waiting_for(self, job: JobRecord) -> list[waiting.Blocker]:
        """What a queued job waits for now; ``[]`` once it left the queue."""
        with self._core.tx() as c:
            return waiting_for(c, self._core, job, self._core.now())


@dataclass(frozen=True)
class Tasks:
    """An array's tasks, one job per index (EXT-ARRAY-1), each told its array and index."""

    array_id: str
    indexes: Sequence[int]


def enqueue(
    conn: sql.Db,
    now: int,
    req: NewJob,
    fleet: Callable[[], list[DeviceSnap]],
    tasks: Tasks | None = None,
) -> JobRecord:
    """STORE-056 in the open transaction: the job, or each of ``tasks`` in queue order (the first
    answered); the job that has the key instead; ``fleet`` gives the devices as the rules read
    them."""
    runtime = int(req.max_runtime_seconds)
    pins = req.device_ids
    count = len(pins) or req.count
    parsed = selectors.parse(req.selector) if req.selector else None
    if not req.device_id and not pins:
        _check_fits(parsed, count, runtime, fleet())
    if req.idempotency_key:
        existing = conn.value(
            "SELECT id FROM jobs WHERE idempotency_key = ?", (req.idempotency_key,)
        )
        if existing is not None:
            return queries.job(conn, str(existing))
    if req.device_id or pins:
        runtime = _pinned_runtime(conn, pins or (req.device_id,), runtime)
    indexes: Sequence[int | None] = tasks.indexes if tasks else (None,)
    seq = queries.next_counter(conn, "job_seq", queries.SEQ_START, len(indexes))
    array_id = tasks.array_id if tasks else ""
    job_id = str(uuid.uuid4())
    job = JobRecord(
        id=job_id,
        seq=seq,
        selector=str(parsed) if parsed else "",
        command=list(req.command),
        cwd=req.cwd,
        env=_task_env(req.env, array_id, indexes[0]),
        submitter=req.submitter,
        # An array's key is its first task's: a resubmit finds the array through it.
        idempotency_key=req.idempotency_key or None,
        state=JobState.QUEUED,
        device_id=pins[0] if pins else req.device_id,
        worker_id="",
        exit_code=None,
        kill_reason="",
        submitted_at=now,
        started_at=None,
        finished_at=None,
        priority=req.priority,
        max_runtime_seconds=runtime,
        idle_timeout=int(req.idle_timeout),
        queued_at=now,
        kill_requested=0,
        kill_delivered_at=0,
        kind=req.kind,
        reason=req.reason,
        stdio=req.stdio,
        device_count=count,
        device_ids=pins,
        share_name=req.share_name or req.submitter,
        after_ids=req.after,
        after_any=int(req.after_any),
        after_open=after.wait(conn, job_id, req.after, req.after_any),  # EXT-SHARE-2
        pinned=int(bool(req.device_id or pins)),
        retries=req.retries,
        retry_on=req.retry_on,
        array_id=array_id,
        array_index=indexes[0],
        preemptible=int(req.preemptible),
        no_requeue=int(req.no_requeue),
        preempt_grace_seconds=req.preempt_grace_seconds,
    )
    first = job.columns()
    rows = [first]
    # The other tasks differ from the first only in these columns: 10,000 rows in well under 1 s.
    for n, index in enumerate(indexes[1:], 1):
        task_id = str(uuid.uuid4())
        env = _task_env(req.env, array_id, index)
        rows.append(
            first
            | {
                "id": task_id,
                "seq": seq + n,
                "env": json.dumps(env),
                "idempotency_key": None,
                "array_index": index,
                "after_open": after.wait(conn, task_id, req.after, req.after_any),
            }
        )
    moves.create(conn, JOB, Op.ENQUEUE, *rows)
    return job


def _task_env(env: dict[str, str] | None, array_id: str, index: int | None) -> dict[str, str]:
    """The job's variables; an array's task is also told its array and index (EXT-ARRAY-1)."""
    out = dict(env or {})
    if array_id:
        out.update(RC_ARRAY_ID=array_id, RC_ARRAY_INDEX=str(index))
    return out


def _check_fits(
    parsed: selectors.Selector | None, count: int, runtime: int, devices: list[DeviceSnap]
) -> None:
    """STORE-056 step 2 and EXT-GANG-2 on the registered devices, whatever their state
    and order: some match, some host has ``count`` of them that admit the runtime."""
    matches = devices if parsed is None else [d for d in devices if parsed.matches(d.labels)]
    what = f"selector {str(parsed)!r}" if parsed else "any device"
    if not matches:
        if parsed is None:
            raise errors.NoMatchingDevice("no devices are registered")
        hint = selectors.no_match_hint(parsed, [d.labels for d in devices])
        raise errors.NoMatchingDevice(f"no device matches {what}: {hint}")
    if not scheduling.could_ever_fit(count, matches):
        raise errors.NoMatchingDevice(f"no host has {count} devices matching {what}")
    if not scheduling.could_ever_fit(
        count, (d for d in matches if scheduling.tolerates(d, runtime))
    ):
        highest = max(d.max_runtime_seconds for d in matches)
        raise errors.RuntimeAboveCeiling(
            f"{what}: requested runtime {runtime}s is above every matching device's "
            f"ceiling (highest {highest}s)"
            + (f" on every host with {count} of them" if count > 1 else "")
        )


def _pinned_runtime(conn: sql.Db, pins: tuple[str, ...], runtime: int) -> int:
    """STORE-056 step 4 for each pinned device: it exists and its ceiling admits the
    request; a job asking for none inherits the smallest ceiling (EXT-GANG-5)."""
    rows = {d.id: d for d in queries.devices_by_id(conn, pins)}
    for device_id in pins:
        dev = rows.get(device_id)
        if dev is None:
            raise errors.UnknownDevice(f"unknown device {device_id!r}: no worker registered it")
        if not scheduling.tolerates(dev.snap(), runtime):
            raise errors.RuntimeAboveCeiling(
                f"requested runtime {runtime}s is above {dev.id}'s ceiling of {dev.max_runtime_seconds}s"
            )
    return scheduling.gang_runtime(runtime, (rows[d].max_runtime_seconds for d in pins))


def _disconnected(conn: sql.Db, job: JobRecord) -> bool:
    """The job's worker is gone (STORE-092): a device of it ``unknown``, or out for
    ``worker_lost`` (a several-device job's devices share one worker)."""
    for dev in queries.devices_by_id(conn, job.devices):
        if dev.state == DeviceState.UNKNOWN or (
            dev.state == DeviceState.UNHEALTHY and dev.quarantine_reason == Quarantine.WORKER_LOST
        ):
            return True
    return False


def _position(conn: sql.Db, job: JobRecord, now: int, aging: int) -> int:
    """1 + the queued jobs ahead of ``job`` (STORE-070), in one count: it is polled often."""
    ahead, params = queries.behind(job.priority, job.queued_at, job.seq, now, aging, ahead=True)
    text = f"SELECT count(*) FROM jobs WHERE jobs.state = ? AND jobs.id != ? AND {ahead}"
    args: tuple[Any, ...] = (str(JobState.QUEUED), job.id, *params)
    snap = job.snap()
    if snap.pinned:
        ons = [queries.on_device(pin) for pin in snap.pins]
        text += " AND jobs.selector = '' AND jobs.device_id != ''"
        text += " AND (" + " OR ".join(cond for cond, _ in ons) + ")"
        args += tuple(a for _, pin_args in ons for a in pin_args)
    return 1 + int(conn.value(text, args) or 0)


_HOLDINGS = (
    "SELECT leases.device_id, leases.holder, leases.job_id, leases.kind, leases.reason,"
    " leases.acquired_at, leases.expires_at, jobs.max_runtime_seconds FROM leases"
    " LEFT JOIN jobs ON jobs.id = leases.job_id WHERE leases.released_at IS NULL"
)


def wait_snapshot(
    conn: sql.Db, core: Core, queued: list[JobSnap], order: dict[str, tuple[str, ...]]
) -> waiting.WaitFacts:
    """What the why-rules read, in a few queries however long the queue."""
    limits = core.limits
    records, snaps = core.fleet.read(conn)
    holdings = [
        waiting.Holding(device, holder, job_id, kind, why, since, until, ran if job_id else None)
        for device, holder, job_id, kind, why, since, until, ran in conn.execute(_HOLDINGS)
    ]
    reservations = dict(conn.all("SELECT device_id, job_id FROM reservations"))
    quarantine = {
        d.id: d.quarantine_detail or d.quarantine_reason
        for d in records.values()
        if d.state == _UNHEALTHY
    }
    held = passes.held_by_share(conn) if limits.on else {}
    waiting_jobs = [j.id for j in queued if j.after_open]
    pending = after.pending(conn, waiting_jobs) if waiting_jobs else {}
    for job_id, ids in pending.items():
        given = order.get(job_id, ())
        ids.sort(key=lambda i: given.index(i) if i in given else len(given))
    preempting: dict[str, list[str]] = {}
    if core.preemption.on:
        for by, victim in conn.all(_PREEMPTING):
            preempting.setdefault(str(by), []).append(str(victim))
    capped = {}
    for array_id in {j.array_id for j in queued if j.array_id}:
        cap, active = passes.array_cap(conn, array_id)
        if cap and active >= cap:
            capped[array_id] = cap
    return waiting.WaitFacts(
        snaps, queued, holdings, reservations, quarantine, limits, held, pending, preempting, capped
    )


#: The victims stopping for each job, by ID (EXT-PREEMPT-2).
_PREEMPTING = (
    "SELECT preempted_by, id FROM jobs WHERE state IN ('assigned', 'running')"
    " AND preempted_by != '' ORDER BY id"
)


def waiting_for(conn: sql.Db, core: Core, job: JobRecord, now: int) -> list[waiting.Blocker]:
    """What one queued job waits for at ``now``; ``[]`` for a job not queued."""
    if not job.queued:
        return []
    # The rules read only whether a job reserving a candidate is ahead: the reservers suffice.
    queued = [job.snap(), *(s for s in queries.reserving_snaps(conn) if s.id != job.id)]
    snap = wait_snapshot(conn, core, queued, {job.id: job.after_ids})
    return waiting.waiting_for(job.snap(), snap, core.key(now))


def waiting_for_all(
    conn: sql.Db, core: Core, queued: list[JobRecord], now: int
) -> dict[str, list[waiting.Blocker]]:
    """What every queued job waits for at ``now``, from one snapshot (``/v1/state``)."""
    if not queued:
        return {}
    order = {j.id: j.after_ids for j in queued if j.after_open}
    snap = wait_snapshot(conn, core, [j.snap() for j in queued], order)
    return waiting.waiting_for_all(snap, core.key(now))
