"""Who may run where and in what order: the one copy of each scheduling rule, pure functions over
snapshots, used by enqueue, the pass, explain and queue positions. A draining or MIG-conflicted
device still matches, never assigned or reserved."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from resource_controller.core import selectors
from resource_controller.core.states import DeviceState


@dataclass(frozen=True)
class DeviceSnap:
    """What the scheduling rules read of a device."""

    id: str
    host: str = ""
    state: str = DeviceState.READY
    max_runtime_seconds: int = 0  #: declared runtime ceiling; 0 = none
    labels: Mapping[str, str] = field(default_factory=dict)  #: effective labels
    draining: bool = False  #: EXT-DRAIN-2
    #: Why its name conflicts with its GPU's MIG mode; ``""`` when it does not.
    mig_conflict: str = ""

    @property
    def held_out(self) -> bool:
        """Never assigned or reserved, though matched and pinnable: draining or MIG conflict."""
        return self.draining or bool(self.mig_conflict)

    @property
    def schedulable(self) -> bool:
        """May be assigned now: ``ready`` and not held out."""
        return self.state == _READY and not self.held_out


BY_ID = operator.attrgetter("id")

#: A plain string: comparing with the enum member costs four times as much, per device.
_READY = DeviceState.READY.value


@dataclass(frozen=True)
class JobSnap:
    """What the scheduling rules read of a queued job."""

    id: str
    seq: int
    priority: int = 0
    queued_at: int = 0
    selector: str = ""  #: normalised selector; '' = pinned or any device
    device_id: str = ""  #: the pinned device; '' until assigned otherwise
    max_runtime_seconds: int = 0
    count: int = 1  #: devices wanted on one host
    #: A job pinned to several devices: all of them, by ID; ``device_id`` is the first.
    device_ids: tuple[str, ...] = ()
    #: The name its submitter limit counts it under (EXT-WHO).
    share: str = ""
    #: Jobs it still waits for; above 0 it is not eligible for a pass.
    after_open: int = 0
    #: Devices its latest attempt ended on: tried last (EXT-RETRY-1).
    avoid: tuple[str, ...] = ()
    #: It may be stopped to make room (EXT-PREEMPT-1).
    preemptible: bool = False
    #: The array it is a task of ('' for none): its ``%N`` cap applies (EXT-ARRAY-1).
    array_id: str = ""

    @property
    def pinned(self) -> bool:
        """Pinned to ``device_id``; a job with neither is "any device"."""
        return self.selector == "" and self.device_id != ""

    @property
    def pins(self) -> list[str]:
        """The devices a pinned job is pinned to (its list, or its one device)."""
        return list(self.device_ids) if self.device_ids else [self.device_id]


#: A queue order: sorts jobs ascending, first = next to schedule.
QueueKey = Callable[[JobSnap], Any]

#: The priorities a submit may ask for; aging never lifts a job past the top.
PRIORITY_MIN = -10
PRIORITY_MAX = 10


def queue_key(job: JobSnap) -> tuple[int, int, int]:
    """Priority descending, then ``queued_at``, then ``seq``."""
    return (-job.priority, job.queued_at, job.seq)


def effective_priority(priority: int, queued_at: int, now: int, aging: int) -> int:
    """EXT-FAIR-1: ``priority`` plus one per whole ``aging`` seconds waited, capped at
    ``PRIORITY_MAX``; ``queries.effective_priority_sql`` is this rule in SQL."""
    if aging <= 0 or priority >= PRIORITY_MAX:
        return priority
    steps = max(0, now - queued_at) // aging
    return min(PRIORITY_MAX, priority + steps)


def aged_queue_key(now: int, aging: int) -> QueueKey:
    """The queue order with priority aging at ``now``: effective priority
    descending, then ``queued_at``, then ``seq``; ``queue_key`` itself when aging is off."""
    if aging <= 0:
        return queue_key

    def key(job: JobSnap) -> tuple[int, int, int]:
        return (
            -effective_priority(job.priority, job.queued_at, now, aging),
            job.queued_at,
            job.seq,
        )

    return key


def tolerates(device: DeviceSnap, runtime: int) -> bool:
    """The device's ceiling admits a job asking for ``runtime`` (0 = none)."""
    return runtime == 0 or device.max_runtime_seconds == 0 or device.max_runtime_seconds >= runtime


def matching(
    selector: selectors.Selector | None, devices: Iterable[DeviceSnap]
) -> list[DeviceSnap]:
    """Devices in any state whose labels satisfy ``selector``, by ID; None = every device."""
    found = (d for d in devices if selector is None or selector.matches(d.labels))
    return sorted(found, key=BY_ID)


def candidates(job: JobSnap, devices: Iterable[DeviceSnap], *, ceilings: bool = True) -> list[str]:
    """Devices the job may be placed on, in order: its pins (the ceiling was applied at enqueue), or
    its selector's matches its runtime fits; ``SelectorError`` for a stored selector that no
    longer parses."""
    if job.pinned:
        return job.pins
    found = matching(selectors.parse(job.selector) if job.selector else None, devices)
    return [d.id for d in found if not ceilings or tolerates(d, job.max_runtime_seconds)]


def avoiding(job: JobSnap, ids: list[str]) -> list[str]:
    """``ids`` with the devices the job's latest attempt ended on last: taken only when no
    other fits (EXT-RETRY-1)."""
    if not job.avoid:
        return ids
    return sorted(ids, key=lambda d: d in job.avoid)


def gang_runtime(requested: int, ceilings: Iterable[int]) -> int:
    """The runtime of a job on several devices: the smallest declared ceiling wins, and a
    job that asked for none inherits it, as a one-device job inherits its device's."""
    declared = [c for c in ceilings if c > 0]
    # Only a positive request is its own (a stored negative one predates EXT-LIMITS-1).
    return requested if requested > 0 else min(declared, default=0)


def could_ever_fit(count: int, devices: Iterable[DeviceSnap]) -> bool:
    """Some single host has at least ``count`` of ``devices`` (EXT-GANG-2's submit check);
    it stops at the first that does, since counting a fleet of 10,000 was most of a submit."""
    per_host: dict[str, int] = {}
    for d in devices:
        n = per_host[d.host] = per_host.get(d.host, 0) + 1
        if n >= count:
            return True
    return False


def competes(job: JobSnap, device_ids: set[str], devices: Iterable[DeviceSnap]) -> bool:
    """The job waits for one of ``device_ids`` (explain's queue depth)."""
    try:
        return any(d in device_ids for d in candidates(job, devices, ceilings=False))
    except selectors.SelectorError:
        return False


def queue_position(job: JobSnap, queued: Iterable[JobSnap], key: QueueKey = queue_key) -> int:
    """1-based position of queued ``job`` among ``queued``: a pinned job's among the jobs
    pinned to its devices, any other's among every job (an upper bound)."""
    mine = key(job)
    ahead = (o for o in queued if o.id != job.id and key(o) < mine)
    if job.pinned:
        pins = set(job.pins)
        ahead = (o for o in ahead if o.pinned and not pins.isdisjoint(o.pins))
    return 1 + sum(1 for _ in ahead)
