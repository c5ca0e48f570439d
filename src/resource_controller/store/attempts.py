"""The end of a job's attempt, in the open transaction: the job ends, or ``core.retry``'s verdict
sends it back to the queue as the same job, its attempt recorded in ``job_attempts``."""

from __future__ import annotations

from typing import Any

from resource_controller.core import retry
from resource_controller.core.states import JobState
from resource_controller.core.transitions import JOB, Op
from resource_controller.store import moves, sql
from resource_controller.store.records import AttemptRecord, JobRecord, join_ids

_ATTEMPT_COLS = ", ".join(AttemptRecord._fields)


def end(
    conn: sql.Db, op: Op, job: JobRecord, state: str, reason: str, now: int, **measured: Any
) -> str | None:
    """End ``job``'s current attempt in ``state`` by ``op``: the state the job is in after it
    (``queued`` when it queues again), or None when it was no longer active."""
    ruled = retry.verdict(_attempt(job), state)
    # A ``--no-requeue`` victim its worker stopped ends ``killed``; one whose host was lost (a
    # sweep, a reap: ops that only lose) ends ``lost`` for its own reason.
    stopped = ruled.preempted and JobState.KILLED in JOB.move(op).targets
    if ruled.preempted and (ruled.requeue or stopped):
        reason = retry.preempted_reason(job.preempted_by)
    if not ruled.requeue:
        state = JobState.KILLED if stopped else state
        moved = moves.end_job(conn, op, job.id, state, reason, now, **measured)
        return state if moved else None
    gone = job.devices
    pins = {} if job.pinned else {"device_id": "", "device_ids": ""}
    moved = moves.move(
        conn,
        JOB,
        Op.REQUEUE,
        "id = ?",
        (job.id,),
        state=JobState.QUEUED,
        attempt=job.attempt + 1,
        preemptions=job.preemptions + int(ruled.preempted),
        avoid_device_ids="" if job.pinned else join_ids(gone),
        worker_id="",
        exit_code=None,
        kill_reason="",
        started_at=None,
        finished_at=None,
        kill_requested=0,
        kill_delivered_at=0,
        preempted_by="",
        gpu_util_mean=None,
        gpu_mem_peak_bytes=None,
        gpu_samples=None,
        **pins,
    )
    if not moved:
        return None
    ended_as = retry.PREEMPTED if ruled.preempted else state
    row = AttemptRecord(
        job.id,
        job.attempt,
        join_ids(gone),
        job.worker_id,
        job.started_at,
        now,
        ended_as,
        measured.get("exit_code"),
        reason,
    )
    conn.execute(
        f"INSERT INTO job_attempts ({_ATTEMPT_COLS}) VALUES ({sql.marks(len(row))})", tuple(row)
    )
    return JobState.QUEUED


def requeues(job: JobRecord, state: str) -> bool:
    """Whether ``state`` reported for the active ``job`` sends it back to the queue."""
    return job.active and retry.verdict(_attempt(job), state).requeue


def _attempt(job: JobRecord) -> retry.Attempt:
    return retry.Attempt(
        kind=job.kind,
        attempt=job.attempt,
        retries=job.retries,
        retry_on=job.retry_on,
        preemptions=job.preemptions,
        kill_requested=bool(job.kill_requested) and not job.preempted_by,
        preempted_by=job.preempted_by,
        no_requeue=bool(job.no_requeue),
    )


def of_job(conn: sql.Db, job_id: str) -> list[AttemptRecord]:
    """The job's earlier attempts, first first (the current one is the job row's)."""
    text = f"SELECT {_ATTEMPT_COLS} FROM job_attempts WHERE job_id = ? ORDER BY attempt"
    return [AttemptRecord._make(r) for r in conn.execute(text, (job_id,))]
