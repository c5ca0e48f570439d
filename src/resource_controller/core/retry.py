"""Whether an attempt's end sends its job back to the queue (EXT-RETRY-1, EXT-PREEMPT-2): the one
rule, read by every place an attempt ends (a report, a sweep, a registration's reap)."""

from __future__ import annotations

from typing import NamedTuple

from resource_controller.core.states import JobState, Kind, RetryOn

#: The state an attempt stopped to make room ends in, in ``attempts`` (never a job's state).
PREEMPTED = "preempted"

#: Which attempt ends each ``retry_on`` calls for another attempt.
_RETRIED: dict[str, frozenset[str]] = {
    RetryOn.LOST: frozenset({JobState.LOST}),
    RetryOn.FAILED: frozenset({JobState.FAILED}),
    RetryOn.ANY: frozenset({JobState.LOST, JobState.FAILED, JobState.KILLED}),
}


class Attempt(NamedTuple):
    """What the rule reads of a job whose attempt ends."""

    kind: str
    attempt: int
    retries: int
    retry_on: str
    preemptions: int
    #: A person asked for the kill (a preemption's kill is not theirs).
    kill_requested: bool
    #: The job this attempt was stopped for; '' when none.
    preempted_by: str
    no_requeue: bool


class Verdict(NamedTuple):
    #: The job goes back to ``queued``, as the same job with ``attempt`` one higher.
    requeue: bool
    #: The attempt was stopped to make room: counted apart from the retries.
    preempted: bool


def verdict(job: Attempt, state: str) -> Verdict:
    """An attempt ending in ``state``: a preempted one queues again unless ``no_requeue``; any
    other while retries are left and its ``retry_on`` names the end. A person's kill, a hold and
    a success never retry."""
    if job.kind == Kind.HOLD or state == JobState.SUCCEEDED:
        return Verdict(False, False)
    if job.preempted_by:
        return Verdict(not job.no_requeue, True)
    used = job.attempt - 1 - job.preemptions
    if used >= job.retries or (state == JobState.KILLED and job.kill_requested):
        return Verdict(False, False)
    return Verdict(state in _RETRIED.get(job.retry_on, frozenset()), False)


def preempted_reason(by: str) -> str:
    """The ``kill_reason`` of an attempt, or a ``--no-requeue`` job, stopped for ``by``."""
    return f"preempted by {by}"
