"""What an operation changed, as data, acted on after commit: nothing wakes inside one."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from resource_controller import errors
from resource_controller.controller.hub import Hub
from resource_controller.controller.webhooks import JOB_PREEMPTED, Notice
from resource_controller.core.retry import preempted_reason
from resource_controller.core.states import JobState
from resource_controller.store.records import PassResult

T = TypeVar("T")

_NONE: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Wake:
    """The wake-ups a committed change implies; empty means nothing to wake."""

    #: A scheduling pass soon: the change can make a queued job placeable.
    schedule: bool = False
    #: A pass already ran inside the operation (submit's): nothing to kick.
    scheduled: bool = False
    #: Jobs that reached a terminal state, whose log followers finish (maybe a lease ID).
    ended: frozenset[str] = _NONE
    #: Workers whose long poll has something new: an assignment or a kill.
    workers: frozenset[str] = _NONE
    #: Jobs with newly stored output: their log followers read it.
    output: frozenset[str] = _NONE
    #: The device table changed: what a "devices" event will announce.
    devices: bool = False
    #: Job states to announce on the event stream, in order: (job ID, state).
    jobs: tuple[tuple[str, str], ...] = ()
    #: Many jobs changed at once (a scheduler-loop pass assigned some, an array was submitted or
    #: ended): one bare "jobs" event, where one per job would overflow a reader's buffer.
    assigned: bool = False
    #: A sweep marked a device unhealthy, lost a job or expired a lease: a bare "devices" event.
    swept: bool = False
    #: Webhook events raised by the change, stamped when raised.
    notices: tuple[Notice, ...] = ()
    #: Every long poll and log follower re-checks (another controller's change too large to name).
    everyone: bool = False
    #: Victims a pass chose, with the job each makes room for: ``job.preempted`` (EXT-PREEMPT-3).
    preempted: tuple[tuple[str, str], ...] = ()

    def __or__(self, other: Wake) -> Wake:
        """Both changes' wake-ups: flags or'ed, sets joined, sequences in order."""
        return Wake(
            **{f.name: _join(getattr(self, f.name), getattr(other, f.name)) for f in _FIELDS}
        )

    @property
    def passes(self) -> bool:
        """A scheduling pass follows the change: kicked here, or already run."""
        return self.schedule or self.scheduled

    @staticmethod
    def jobs_ended(ids: Iterable[str], *, schedule: bool = False) -> Wake:
        return Wake(schedule=schedule, ended=frozenset(ids))

    @staticmethod
    def job(job_id: str, state: str) -> Wake:
        return Wake(jobs=((job_id, str(state)),))

    @staticmethod
    def killed(job_id: str, *, schedule: bool = False) -> Wake:
        """A job ended ``killed`` here: its followers finish and the stream says so."""
        return Wake.jobs_ended([job_id], schedule=schedule) | Wake.job(job_id, JobState.KILLED)

    @staticmethod
    def poll(worker_ids: Iterable[str]) -> Wake:
        return Wake(workers=frozenset(w for w in worker_ids if w))

    @staticmethod
    def of_pass(done: PassResult, *, skip: str = "", nudge: bool = True) -> Wake:
        """A pass's wake-ups: assigned workers' polls, a "jobs" event, dependency_failed endings."""
        ended = [j for j in done.ended if j != skip]
        workers = [*(a.worker_id for a in done.assigned), *(p.worker_id for p in done.preempted)]
        return Wake.poll(workers) | Wake(
            ended=frozenset(ended),
            jobs=tuple((j, str(JobState.KILLED)) for j in ended),
            assigned=nudge and bool(done.assigned),
            preempted=tuple((p.job_id, p.by) for p in done.preempted),
        )


NOTHING = Wake()
SCHEDULE = Wake(schedule=True)
_FIELDS = dataclasses.fields(Wake)


def _join(a: Any, b: Any) -> Any:
    return a or b if isinstance(a, bool) else a | b if isinstance(a, frozenset) else a + b


@dataclass(frozen=True)
class Done(Generic[T]):
    """An operation's committed outcome: its value or the error to answer with (a refusal
    after a commit, as a ``no_wait`` submit's 409), and its wake-ups, applied either way."""

    value: T
    wake: Wake = NOTHING
    error: errors.RcError | None = None


def apply(hub: Hub, wake: Wake, *, forward: bool = True) -> None:
    """Act on the wake-ups of a committed change; the only caller of the hub's wake methods.
    ``forward``: pass them on to the other controllers too (not for theirs)."""
    for worker_id in sorted(wake.workers):
        hub.workers.wake(worker_id)
    for job_id in sorted(wake.ended):
        hub.job_changed(job_id)
    for job_id in sorted(wake.output):
        hub.logs.wake(job_id)
    if wake.schedule:
        hub.kick_scheduler()
    if wake.everyone:
        hub.wake_everyone()
    publish(hub, wake, notify=forward)
    if forward and hub.forward is not None:
        hub.forward(wake)


def publish(hub: Hub, wake: Wake, *, notify: bool = True) -> None:
    """The event-stream messages and webhook events of a committed change (EVT-*, HOOKN-*);
    ``notify``: the change is this controller's, whose webhooks say it (once, fleet-wide)."""
    for job_id, state in wake.jobs:
        hub.events.job(job_id, state)
    if wake.assigned:
        hub.events.jobs_nudge()
    if wake.devices:
        hub.events.devices_changed()
    if wake.swept:
        hub.events.devices_nudge()
    for job_id, by in wake.preempted:
        hub.events.preempted(job_id, by)
    if hub.notifier is not None and notify:
        for notice in wake.notices:
            hub.notifier.emit(notice)
        for job_id, by in wake.preempted:
            reason = preempted_reason(by)
            hub.notifier.emit(Notice(JOB_PREEMPTED, hub.events.clock(), "", job_id, reason))


async def perform(hub: Hub, op: Awaitable[Done[T]]) -> T:
    """Run an operation, apply its wake-ups after it committed, then answer or raise."""
    done = await op
    apply(hub, done.wake)
    if done.error is not None:
        raise done.error
    return done.value
