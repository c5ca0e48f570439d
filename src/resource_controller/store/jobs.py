"""The queue: enqueue, cancel, kill flags, hand-out and terminal reports (store.md §7, §9-11).

Enqueue never assigns: the scheduling pass in ``leases.py`` is the only
place a device changes hands, so a client told a queue position is never overtaken
by a side door. Every state change here is a move from the transition table
(``core.transitions``, applied by ``store.moves``), which adds the legal source states
to its WHERE clause; callers check the row count. Which devices a job may use, the
queue order and queue positions are ``core.scheduling``'s.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from resource_controller import errors
from resource_controller.core import limits, scheduling, selectors
from resource_controller.core.scheduling import DeviceSnap
from resource_controller.core.states import (
    ACTIVE,
    TERMINAL,
    DeviceState,
    JobState,
    Kind,
    Quarantine,
)
from resource_controller.core.transitions import DEVICE, JOB, Op
from resource_controller.store import after as dependencies
from resource_controller.store import fleet, leases, moves, queries
from resource_controller.store.records import NO_GPU_USE, GpuUse, JobRecord, Release

KILL_REDELIVERY = 30  #: seconds before an undelivered kill flag is offered again

_ACTIVE = tuple(s.value for s in ACTIVE)


@dataclass(frozen=True)
class NewJob:
    """What a submitter asks for; validated by the API layer first."""

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


def enqueue(
    conn: queries.Conn,
    now: int,
    req: NewJob,
    snapshot: Callable[[], list[DeviceSnap]] | None = None,
) -> JobRecord:
    """Record a job in state ``queued``, or return the job that has its key.

    ``snapshot`` gives the fleet as the scheduling rules read it (the store's
    ``FleetSnapshot``), for the submit-time check of a selector or any-device job; the
    whole fleet is read when it is not given."""
    if not req.command:
        raise errors.BadRequest("command must not be empty")
    if not req.submitter:
        raise errors.BadRequest("submitter must not be empty")
    if req.device_id and req.selector:
        raise errors.BadRequest("give device_id or selector, not both")
    pins = tuple(sorted(req.device_ids))
    if pins and (req.device_id or req.selector):
        raise errors.BadRequest("device_ids takes the place of device_id and selector")
    count = len(pins) if pins else req.count
    if count < 1 or (pins and req.count not in (1, len(pins))) or (req.device_id and count != 1):
        raise errors.BadRequest(f"count {req.count} does not fit the devices asked for")
    if len(pins) == 1:  # a list of one is an ordinary pin
        req = dataclasses.replace(req, device_id=pins[0], device_ids=())
        pins = ()
    runtime = int(req.max_runtime_seconds)
    for name, value in (("max_runtime_seconds", runtime), ("idle_timeout", int(req.idle_timeout))):
        if not limits.SECONDS.low <= value <= limits.SECONDS.high:
            # The API refuses these first; never store a runtime that
            # escapes a ceiling (negative) or overflows a lease deadline (huge).
            raise errors.BadRequest(f"{name} must be in {limits.SECONDS.text()} seconds")
    selector_text = ""
    if not req.device_id and not pins:
        # Selector job, or "any device" when no selector is given.
        parsed = selectors.parse(req.selector) if req.selector else None
        selector_text = str(parsed) if parsed else ""
        devices = snapshot() if snapshot else fleet.FleetSnapshot().read(conn)[1]
        # In any order: the checks below only count hosts (sorting 10,000 devices by ID
        # for them was a fifth of a submit's CPU).
        matches = devices if parsed is None else [d for d in devices if parsed.matches(d.labels)]
        what = f"selector {selector_text!r}" if parsed else "any device"
        if not matches:
            if parsed is None:
                raise errors.NoMatchingDevice("no devices are registered")
            hint = selectors.no_match_hint(parsed, [d.labels for d in devices])
            raise errors.NoMatchingDevice(f"no device matches {what}: {hint}")
        if not scheduling.could_ever_fit(count, matches):
            # No single host has enough of them, now or ever.
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
    if req.idempotency_key:
        existing = queries.job_id_with_key(conn, req.idempotency_key)
        if existing is not None:
            return queries.job(conn, existing)
    if req.device_id:
        dev = queries.device(conn, req.device_id)
        if dev is None:
            raise errors.UnknownDevice(f"unknown device {req.device_id!r}: no worker registered it")
        if not scheduling.tolerates(dev.snap(), runtime):
            raise errors.RuntimeAboveCeiling(
                f"requested runtime {runtime}s is above {dev.id}'s ceiling of {dev.max_runtime_seconds}s"
            )
        runtime = scheduling.effective_runtime(runtime, dev.max_runtime_seconds)
    if pins:
        runtime = _pinned_gang_runtime(conn, pins, runtime)
    waiting_for = tuple(dict.fromkeys(req.after))  # a job named twice is waited for once
    waits = dependencies.edges(conn, waiting_for, req.after_any)  # EXT-SHARE-2
    seq = queries.next_seq(conn)
    job = JobRecord(
        id=str(uuid.uuid4()),
        seq=seq,
        selector=selector_text,
        command=list(req.command),
        cwd=req.cwd,
        env=dict(req.env or {}),
        submitter=req.submitter,
        idempotency_key=req.idempotency_key or None,
        state=JobState.QUEUED,
        device_id=req.device_id,
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
        kind=req.kind or Kind.JOB,
        reason=req.reason,
        stdio=req.stdio,
        device_count=count,
        device_ids=pins,
        share_name=req.share_name or req.submitter,
        after_ids=waiting_for,
        after_any=int(req.after_any),
        after_open=len(waits),
    )
    if pins:
        job = job._replace(device_id=pins[0])
    moves.create(conn, JOB, Op.ENQUEUE, job.columns())
    if waits:
        dependencies.insert(conn, job.id, waits)
    return job


def _pinned_gang_runtime(conn: queries.Conn, pins: tuple[str, ...], runtime: int) -> int:
    """STORE-056 step 4 for each device of a pinned list: all exist, on one host, each
    ceiling admits the request; a job asking for none gets the smallest."""
    rows = {d.id: d for d in queries.all_devices(conn) if d.id in pins}
    for device_id in pins:
        dev = rows.get(device_id)
        if dev is None:
            raise errors.UnknownDevice(f"unknown device {device_id!r}: no worker registered it")
        if not scheduling.tolerates(dev.snap(), runtime):
            raise errors.RuntimeAboveCeiling(
                f"requested runtime {runtime}s is above {dev.id}'s ceiling of {dev.max_runtime_seconds}s"
            )
    hosts = sorted({rows[d].host for d in pins})
    if len(hosts) > 1:
        raise errors.BadRequest(f"device_ids must all be on one host, not on {', '.join(hosts)}")
    return scheduling.gang_runtime(runtime, (rows[d].max_runtime_seconds for d in pins))


def queue_position(conn: queries.Conn, job: JobRecord, now: int = 0, aging: int = 0) -> int:
    """1-based position among queued jobs ahead of it; 0 when not queued.

    With aging on, "ahead" is by effective priority at ``now``."""
    if not job.queued:
        return 0
    # ``scheduling.queue_position``'s rule as one count: a queued job's view is polled
    # every half second by whoever waits for it, and building every queued job to
    # compare keys cost 6 ms a view at 1,500 queued.
    ahead, params = queries.ahead_of(job.priority, job.queued_at, job.seq, now, aging)
    text = f"SELECT count(*) FROM jobs WHERE jobs.state = ? AND jobs.id != ? AND {ahead}"
    args: tuple[Any, ...] = (str(JobState.QUEUED), job.id, *params)
    snap = job.snap()
    if snap.pinned:
        ons = [queries.on_device(pin) for pin in snap.pins]
        text += " AND jobs.selector = '' AND jobs.device_id != ''"
        text += " AND (" + " OR ".join(cond for cond, _ in ons) + ")"
        args += tuple(a for _, pin_args in ons for a in pin_args)
    return 1 + int(conn.value(text, args) or 0)


def cancel_queued(conn: queries.Conn, now: int, job_id: str, reason: str) -> bool:
    """queued -> killed; False (nothing changed) for any other state."""
    db = conn
    done = moves.move(
        db,
        JOB,
        Op.CANCEL_QUEUED,
        "id = ?",
        (job_id,),
        state=JobState.KILLED,
        kill_reason=reason,
        finished_at=now,
    )
    if done != 1:
        return False
    db.execute("DELETE FROM reservations WHERE job_id = ?", (job_id,))
    return True


class KillRequest(StrEnum):
    """What asking to kill an active job did."""

    #: Flagged for its worker, which stops the process and reports.
    REQUESTED = "requested"
    #: Its worker is gone: ended here, its devices kept out.
    FINALIZED = "finalized"
    #: It had already ended.
    NOT_CANCELLABLE = "not_cancellable"


def request_kill(
    conn: queries.Conn, now: int, job_id: str, reason: str, finalize_disconnected: bool
) -> KillRequest:
    """Flag an active job for its worker, or end it here when its worker is gone."""
    job = queries.job(conn, job_id)
    if not job.active:
        return KillRequest.NOT_CANCELLABLE
    # A several-device job's devices share one worker, so they go quiet together; any
    # one of them proving the worker gone is enough.
    devs = [queries.device(conn, d) for d in job.devices]
    disconnected = any(
        dev is not None
        and (
            dev.state == DeviceState.UNKNOWN
            or (
                dev.state == DeviceState.UNHEALTHY
                and dev.quarantine_reason == Quarantine.WORKER_LOST
            )
        )
        for dev in devs
    )
    if finalize_disconnected and disconnected:
        moves.move(
            conn,
            JOB,
            Op.KILL_FINALIZE,
            "id = ?",
            (job_id,),
            state=JobState.KILLED,
            kill_reason=reason,
            finished_at=now,
            kill_requested=1,
            kill_delivered_at=0,
        )
        # The device stays out: nothing proves it is empty.
        leases.release_for_job(conn, now, job_id)
        return KillRequest.FINALIZED
    conn.execute(
        "UPDATE jobs SET kill_requested = 1, kill_delivered_at = 0 WHERE id = ?", (job_id,)
    )
    return KillRequest.REQUESTED


def take_work(conn: queries.Conn, now: int, worker_id: str) -> tuple[list[JobRecord], list[str]]:
    """Hand out this worker's assigned jobs and its due kill flags, in one transaction.

    Each job moves assigned -> running with ``started_at`` = now BEFORE the response is
    written, and only the poll whose update changed it gets it, so
    a retried or concurrent poll never starts a job twice. Kill flags are a take: each
    is stamped delivered and not offered again for 30 s.
    """
    db = conn
    rows = moves.move_returning(
        db,
        JOB,
        Op.MARK_RUNNING,
        "worker_id = ?",
        (worker_id,),
        _RETURNING,
        state=JobState.RUNNING,
        started_at=now,
    )
    handed: list[JobRecord] = []
    if rows:
        epochs = queries.epochs(db, [r[0] for r in rows])
        handed = sorted(
            (queries.job_record(r, epochs.get(r[0], 0)) for r in rows),
            key=lambda job: (job.submitted_at, job.seq),
        )
    due = queries.due_kills(db, worker_id, now - KILL_REDELIVERY, [*_ACTIVE, JobState.KILLED])
    if due:
        queries.mark_kills_delivered(db, due, now)
    return handed, due


_RETURNING = ", ".join(queries.JOB_COLS)


def mark_running(conn: queries.Conn, now: int, job_id: str) -> None:
    """assigned -> running; a no-op for any other state or an unknown ID."""
    moves.move(
        conn,
        JOB,
        Op.MARK_RUNNING,
        "id = ?",
        (job_id,),
        state=JobState.RUNNING,
        started_at=now,
    )


def release(
    conn: queries.Conn,
    now: int,
    job_id: str,
    state: str,
    exit_code: int | None,
    reason: str,
    gpu: GpuUse = NO_GPU_USE,
) -> Release:
    """The worker's terminal report: end the job, release its leases, free a busy device."""
    if state not in TERMINAL:
        raise errors.InvalidTransition(f"state {state!r} is not terminal")
    return release_job(conn, now, queries.job(conn, job_id), state, exit_code, reason, gpu)


def release_job(
    conn: queries.Conn,
    now: int,
    job: JobRecord,
    state: str,
    exit_code: int | None,
    reason: str,
    gpu: GpuUse = NO_GPU_USE,
) -> Release:
    """``release`` of a job already read in this transaction; ``gpu`` is what the worker
    measured of its GPUs, kept with the outcome and weighting the usage
    rollup's GPU-hours."""
    if job.terminal:
        return Release(job=job, was_terminal=True)
    if not job.active:
        raise errors.InvalidTransition(
            f"job {job.id} is {job.state}; only an active job can be released"
        )
    db = conn
    done = moves.move(
        db,
        JOB,
        Op.RELEASE,
        "id = ?",
        (job.id,),
        state=state,
        exit_code=exit_code,
        kill_reason=reason,
        finished_at=now,
        gpu_util_mean=gpu.util_mean,
        gpu_mem_peak_bytes=gpu.mem_peak_bytes,
        gpu_samples=gpu.samples,
    )
    if done != 1:
        raise errors.StoreError(f"job {job.id} changed state under a serialised release")
    # The devices first, then the leases: a grant flips its device before it inserts
    # the lease, and both orders alike keep two controllers' grant and release from
    # waiting on each other's rows (the device counter, the submitter's held count).
    freed = queries.live_lease_devices(db, job.id)
    if freed:
        # Only a busy device returns: an unhealthy one (faulted by verify) stays out,
        # an unknown one waits for its worker's next heartbeat.
        moves.move(
            db, DEVICE, Op.RELEASE, queries.id_in(len(freed)), freed, state=DeviceState.READY
        )
    leases.release_for_job(db, now, job.id, util=gpu.util_mean)
    ended = job._replace(
        state=state,
        exit_code=exit_code,
        kill_reason=reason,
        finished_at=now,
        gpu_util_mean=gpu.util_mean,
        gpu_mem_peak_bytes=gpu.mem_peak_bytes,
        gpu_samples=gpu.samples,
    )
    return Release(job=ended, was_terminal=False)


def list_jobs(
    conn: queries.Conn,
    limit: int,
    device: str = "",
    submitter: str = "",
    state: str = "",
    id_prefix: str = "",
    before: str = "",
) -> list[JobRecord]:
    """Newest first, ties by ID descending, with lease epochs.

    ``id_prefix`` keeps jobs whose ID starts with it, compared as a plain
    substring so that ``%`` and ``_`` are never wildcards, on SQLite as on PostgreSQL.
    ``before`` keeps the jobs that come after that job in this order, whatever its own
    state: the next page of a listing (``GET /v1/jobs?before=``). A job never leaves
    the table and its ``submitted_at`` never changes, so the cursor stays where it was.
    """
    if not 1 <= limit <= 200:
        raise errors.BadRequest(f"limit must be between 1 and 200, got {limit}")
    after = None
    if before:
        after = queries.submitted_at(conn, before)
        if after is None:
            raise errors.BadRequest(f"before: no job has the ID {before[:40]!r}")
    return queries.list_jobs(conn, limit, device, submitter, state, id_prefix, after)


def queued(conn: queries.Conn, now: int = 0, aging: int = 0) -> list[JobRecord]:
    """Queued jobs in scheduling order, aged at ``now`` when on."""
    return queries.jobs_where(
        conn, "jobs.state = ?", (str(JobState.QUEUED),), order=queries.queue_order(now, aging)
    )


def active(conn: queries.Conn) -> list[JobRecord]:
    """Assigned and running jobs, newest submission first, with their lease
    epochs."""
    return queries.active_jobs(conn)


def logs_to_prune(conn: queries.Conn, cutoff: int, limit: int) -> list[str]:
    """Jobs that ended before ``cutoff`` whose stored output is not yet deleted, oldest
    end first, at most ``limit``; found through ``jobs_log_retention``."""
    rows = conn.execute(
        "SELECT id FROM jobs WHERE logs_pruned = 0 AND finished_at IS NOT NULL"
        " AND finished_at < ? ORDER BY finished_at, id LIMIT ?",
        (cutoff, limit),
    )
    return [str(r[0]) for r in rows]


def mark_logs_pruned(conn: queries.Conn, job_ids: list[str]) -> None:
    """Record that these jobs' stored output is gone; the job rows stay."""
    if job_ids:
        conn.execute(
            f"UPDATE jobs SET logs_pruned = 1 WHERE {queries.id_in(len(job_ids))}", job_ids
        )
