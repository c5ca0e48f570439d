"""The one scheduling pass loop: the store runs ``run_pass`` over the queue as it reads it; ``plan``
over a snapshot, assuming every placement succeeds."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from resource_controller.core import selectors
from resource_controller.core.planner import Planner
from resource_controller.core.preempt import Preemption
from resource_controller.core.scheduling import DeviceSnap, JobSnap, QueueKey, queue_key
from resource_controller.core.share import NO_LIMITS, SubmitterLimits


class Placement(StrEnum):
    """How trying one of a job's choices ended."""

    PLACED = "placed"
    #: The job left the queue since it was read (or cannot be read): it claims nothing.
    GONE = "gone"
    #: A device of the choice could not be had: the next choice is tried.
    NOT_READY = "not_ready"


#: Places a job on a choice: the store's in a transaction, the snapshot's assumes success.
Place = Callable[[JobSnap, tuple[str, ...]], Placement]

#: A queue entry's leading fields: a pinned job behind a busy device needs no more.
ENTRY_ID, ENTRY_DEVICE, ENTRY_PLAIN_PIN, ENTRY_SHARE = range(4)


class PassQueue(Protocol):
    """The queue as a pass walks it; entries lead with ``ENTRY_*`` fields, as building a ``JobSnap``
    for 10,000 pinned jobs was most of a pass."""

    def __iter__(self) -> Iterator[Sequence[Any]]: ...

    def snap(self, entry: Sequence[Any]) -> JobSnap | None:
        """The whole job of ``entry``; None when it left the queue or cannot be read."""

    def pinned_elsewhere(self) -> Iterable[JobSnap]:
        """The queued jobs pinned to a device the fleet does not have, in queue order."""


@dataclass(frozen=True)
class Plan:
    assignments: dict[str, tuple[str, ...]]  #: job -> the devices it gets
    reservations: dict[str, str]  #: device -> the job that waits for it
    unparsable: list[str]  #: jobs skipped because their selector no longer parses
    #: Jobs a submitter limit kept waiting, with that limit.
    limited: dict[str, int] = field(default_factory=dict)
    #: Jobs no device of the fleet could ever run.
    unmatched: list[str] = field(default_factory=list)
    #: Victims chosen in this pass -> the job they make room for (EXT-PREEMPT-1).
    preempt: dict[str, str] = field(default_factory=dict)


def run_pass(queue: PassQueue, planner: Planner, place: Place) -> Plan:
    """One pass: each job is placed on the first choice ``place`` gives it, or claims what it waits
    for; the walk stops once every reservable device is claimed."""
    assignments: dict[str, tuple[str, ...]] = {}
    unparsable: list[str] = []
    limited: dict[str, int] = {}
    unmatched: list[str] = []
    limits_on = planner.limited_on
    caps = planner.caps
    for entry in queue:
        if planner.full:
            _claim_vanished(planner, queue.pinned_elsewhere())
            break
        if entry[ENTRY_PLAIN_PIN]:
            # A plain pin whose device cannot be had now can only claim it: no job built.
            if limits_on:
                limit = planner.limited(entry[ENTRY_SHARE], 1)
                if limit is not None:
                    limited[entry[ENTRY_ID]] = limit
                    continue
            if planner.claim_unless_free(entry[ENTRY_DEVICE], entry[ENTRY_ID]):
                continue
        job = queue.snap(entry)
        if job is None:
            continue
        if caps is not None and not caps.admits(job.array_id):
            continue  # neither placed nor claiming: its siblings hold the room
        try:
            offer = planner.offer(job)
        except selectors.SelectorError:
            unparsable.append(job.id)
            continue
        if offer.limit is not None:
            limited[job.id] = offer.limit
            continue
        if not offer.candidates:
            unmatched.append(job.id)
            continue
        for choice in offer.choices:
            placement = place(job, choice)
            if placement is Placement.PLACED:
                assignments[job.id] = choice
                planner.placed(job, choice)
                break
            if placement is Placement.GONE:
                break
        else:
            planner.blocked(job, offer)
    chosen = planner.preemption.chosen if planner.preemption is not None else {}
    return Plan(assignments, dict(planner.reserved), unparsable, limited, unmatched, chosen)


def _claim_vanished(planner: Planner, jobs: Iterable[JobSnap]) -> None:
    """Each device with no row is claimed by the first job pinned to it, unless at its limit."""
    for job in jobs:
        if job.pinned and planner.limited(job.share, job.count) is None:
            for device_id in job.pins:  # a pinned list claims all of it
                planner.reserve(device_id, job.id)


class SnapshotQueue:
    """A list of jobs as a ``PassQueue``: what ``plan`` walks."""

    def __init__(self, jobs: Iterable[JobSnap], key: QueueKey, known: Mapping[str, Any]) -> None:
        self._jobs = sorted((j for j in jobs if not j.after_open), key=key)
        self._by_id = {j.id: j for j in self._jobs}
        self._known = known

    def __iter__(self) -> Iterator[Sequence[Any]]:
        for j in self._jobs:
            plain = j.pinned and not j.device_ids and j.count <= 1
            yield (j.id, j.device_id, plain, j.share)

    def snap(self, entry: Sequence[Any]) -> JobSnap | None:
        return self._by_id.get(entry[ENTRY_ID])

    def pinned_elsewhere(self) -> Iterable[JobSnap]:
        return [j for j in self._jobs if j.pinned and j.device_id not in self._known]


def plan(
    jobs: Iterable[JobSnap],
    devices: Sequence[DeviceSnap],
    key: QueueKey = queue_key,
    limits: SubmitterLimits = NO_LIMITS,
    held: Mapping[str, int] | None = None,
    preemption: Preemption | None = None,
) -> Plan:
    """A whole pass on a snapshot, as if every assignment it tries succeeds."""
    planner = Planner(devices, limits, held, preemption)
    return run_pass(
        SnapshotQueue(jobs, key, planner.by_id), planner, lambda job, choice: Placement.PLACED
    )
