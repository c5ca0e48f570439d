"""States and reason words (store.md §3-5); which may follow which is ``core.transitions``'."""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    QUEUED = "queued"
    ASSIGNED = "assigned"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    LOST = "lost"


class RetryOn(StrEnum):
    """Which ends of an attempt send its job back to the queue (EXT-RETRY-1)."""

    LOST = "lost"
    FAILED = "failed"
    ANY = "any"


class DeviceState(StrEnum):
    READY = "ready"
    BUSY = "busy"
    UNKNOWN = "unknown"
    UNHEALTHY = "unhealthy"


class Role(StrEnum):
    WORKER = "worker"
    CLIENT = "client"
    ADMIN = "admin"


#: Terminal job states: a job in one of these never changes state again.
TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED, JobState.LOST})
#: Jobs that hold a live lease.
ACTIVE = frozenset({JobState.ASSIGNED, JobState.RUNNING})
ALL_JOB_STATES = frozenset(JobState)


class Quarantine(StrEnum):
    """Stored ``quarantine_reason`` values."""

    FAULT = "fault"
    WORKER_LOST = "worker_lost"
    LEASE_EXPIRED = "lease_expired"
    REGISTRATION = "registration"
    UNRECORDED = ""


#: Reasons a proof may lift without a person (STORE-021 "recoverable").
RECOVERABLE = frozenset({Quarantine.WORKER_LOST, Quarantine.LEASE_EXPIRED, Quarantine.REGISTRATION})


class Kind(StrEnum):
    JOB = "job"
    HOLD = "hold"


class Stdio(StrEnum):
    LOGS = ""
    TTY = "tty"
    PIPE = "pipe"


# Kill reasons the controller itself writes.
REASON_WORKER_LOST = "worker lost"
REASON_LEASE_EXPIRED = "lease expired"
REASON_REREGISTERED = "worker re-registered"
REASON_HOST_REBOOTED = "host rebooted"
REASON_NO_WAIT = "no-wait: device busy"
REASON_SUBMIT_SCHEDULE = "submit failed: could not schedule"
REASON_SUBMIT_READ = "submit failed: could not read job"
#: A job another waited for ended otherwise than it needed; the job's ID follows.
REASON_DEPENDENCY_FAILED = "dependency_failed: "


def dependency_failed(job_id: str) -> str:
    """``dependency_failed: JOB``: the reason of a job whose dependency did not end as needed."""
    return REASON_DEPENDENCY_FAILED + job_id


def kill_reason(submitter: str, *, admin: bool) -> str:
    """The reason the API records when it ends a job itself."""
    if not admin:
        return f"killed by {submitter}"
    return "killed by admin override" + (f" (as {submitter})" if submitter else "")
