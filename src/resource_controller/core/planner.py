"""The decisions of one pass, one job at a time: N-device jobs try hosts best fit first, so a small
job leaves the most room to bigger ones, and a blocked one claims N devices on the host closest
to starting, rebuilt head first every pass, so 1-device jobs behind it cannot starve it. A job
over its submitter limit neither places nor claims."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import overload

from resource_controller.core.arrays import ArrayCaps
from resource_controller.core.preempt import Preemption, outranks
from resource_controller.core.scheduling import BY_ID, DeviceSnap, JobSnap, avoiding, candidates
from resource_controller.core.share import NO_LIMITS, SubmitterLimits, over_limit


@dataclass(frozen=True)
class Offer:
    """What one job may do in this pass."""

    candidates: list[str]  #: every device it may use
    available: list[str]  #: candidates not claimed by a job ahead of it, nor draining
    choices: Sequence[tuple[str, ...]]  #: device sets to try, in order (each ``count`` long)
    #: What it claims when no choice can be had: every available candidate, or N of one host.
    claim: list[str] = field(default_factory=list)
    #: The limit that keeps it waiting (no choices, no claim); None when none does.
    limit: int | None = None


class _Singles(Sequence[tuple[str, ...]]):
    """The one-device choices over ``free``, each made when asked for: a job for any of 10,000
    devices almost always takes the first."""

    __slots__ = ("_free",)

    def __init__(self, free: list[str]) -> None:
        self._free = free

    def __len__(self) -> int:
        return len(self._free)

    @overload
    def __getitem__(self, i: int) -> tuple[str, ...]: ...
    @overload
    def __getitem__(self, i: slice) -> list[tuple[str, ...]]: ...
    def __getitem__(self, i: int | slice) -> tuple[str, ...] | list[tuple[str, ...]]:
        if isinstance(i, slice):
            return [(d,) for d in self._free[i]]
        return (self._free[i],)

    def __iter__(self) -> Iterator[tuple[str, ...]]:
        return ((d,) for d in self._free)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # as a list: equal to one, so unhashable

    def __repr__(self) -> str:
        return repr(list(self))


class FleetIndex:
    """A fleet's snapshots with the sets ``Planner`` asks, kept between passes (rebuilt per pass it
    was a third of a submit's CPU); candidates depend on labels, ceilings and the device set,
    never on states."""

    def __init__(self, devices: Sequence[DeviceSnap]) -> None:
        self.devices: Sequence[DeviceSnap] = sorted(devices, key=BY_ID)
        self.by_id = {d.id: d for d in self.devices}
        self.schedulable = {d.id for d in self.devices if d.schedulable}
        #: Held out: draining or in MIG conflict (``DeviceSnap.held_out``).
        self.draining = {d.id for d in self.devices if d.held_out}
        self.reservable = {d.id for d in self.devices if not d.held_out}
        self.matches: dict[tuple[str, int], list[str]] = {}

    def update(
        self, ordered: Sequence[DeviceSnap], changed: Iterable[DeviceSnap], removed: Iterable[str]
    ) -> None:
        """The fleet is now ``ordered``: ``changed`` are new or changed, ``removed`` gone."""
        stale = False
        for device_id in removed:
            if self.by_id.pop(device_id, None) is not None:
                stale = True
            self.schedulable.discard(device_id)
            self.draining.discard(device_id)
            self.reservable.discard(device_id)
        for d in changed:
            old = self.by_id.get(d.id)
            if (
                old is None
                or old.labels != d.labels
                or old.max_runtime_seconds != d.max_runtime_seconds
            ):
                stale = True
            self.by_id[d.id] = d
            _member(self.schedulable, d.id, d.schedulable)
            _member(self.draining, d.id, d.held_out)
            _member(self.reservable, d.id, not d.held_out)
        if stale:
            self.matches.clear()
        self.devices = ordered


def _member(ids: set[str], device_id: str, present: bool) -> None:
    if present:
        ids.add(device_id)
    else:
        ids.discard(device_id)


class Planner:
    """The decisions of one scheduling pass: ``offer`` each job in queue order, then ``placed`` or
    ``blocked`` (it claims ``Offer.claim``); ``held`` grows as the pass places."""

    def __init__(
        self,
        devices: Sequence[DeviceSnap] | FleetIndex,
        limits: SubmitterLimits = NO_LIMITS,
        held: Mapping[str, int] | None = None,
        preemption: Preemption | None = None,
        caps: ArrayCaps | None = None,
    ) -> None:
        fleet = devices if isinstance(devices, FleetIndex) else FleetIndex(devices)
        self.limits = limits
        #: Whether any limit applies: when not, no job pays for asking.
        self.limited_on = limits.on
        #: Devices held per share name, those placed in this pass included.
        self.held: dict[str, int] = dict(held or {})
        self.devices = fleet.devices
        self.by_id = fleet.by_id
        # The fleet's sets, read only: a method call per candidate was most of a submit.
        self._schedulable = fleet.schedulable
        self._draining_ids = fleet.draining
        self.reserved: dict[str, str] = {}  #: device -> the job claiming it for this pass
        self.taken: set[str] = set()  #: devices assigned in this pass
        self._reservable = fleet.reservable
        self._claimed = 0  #: reservable devices in ``reserved``
        #: ``saturated()``, kept as claims are made: the pass reads it per queued row.
        self.full = False
        #: Candidates per (selector, runtime): a queue is mostly a few distinct asks.
        self._matches = fleet.matches
        #: EXT-PREEMPT-1: None when preemption is off.
        self.preemption = preemption
        self._soft: set[str] = set()  #: claims a preempting job may take over
        #: EXT-ARRAY-1's ``%N`` caps; None: no task's array is capped in this pass.
        self.caps = caps

    def saturated(self) -> bool:
        """Every reservable device is claimed: no job further back can be placed."""
        return self.full

    def _candidates(self, job: JobSnap) -> list[str]:
        """``candidates(job, self.devices)``, computed once per distinct ask (and kept
        with the fleet's index while no device's labels, ceiling or existence change)."""
        if job.pinned:
            return job.pins
        ask = (job.selector, job.max_runtime_seconds)
        found = self._matches.get(ask)
        if found is None:
            found = self._matches[ask] = candidates(job, self.devices)
        return avoiding(job, found)

    def limited(self, share: str, count: int) -> int | None:
        """The limit that keeps a job of ``share`` for ``count`` devices waiting; None if none."""
        if not self.limited_on:
            return None
        return over_limit(self.limits, self.held, share, count)

    def offer(self, job: JobSnap) -> Offer:
        """The job's candidates, the unclaimed ones and the sets to try; none over its limit."""
        count = max(1, job.count)
        if self.limited_on:
            limit = over_limit(self.limits, self.held, job.share, count)
            if limit is not None:
                return Offer([], [], (), [], limit)
        cands = self._candidates(job)
        reserved, draining = self.reserved, self._draining_ids
        available = [d for d in cands if d not in reserved and d not in draining]
        if job.preemptible and self.preemption is not None:
            available = self.preemption.unpromised(job, available)
        taken, schedulable = self.taken, self._schedulable
        free = [d for d in available if d not in taken and d in schedulable]
        if count == 1 or job.pinned:
            # A pinned list is one choice (all of it) and claims all of it, as a pin does.
            want = len(cands) if job.pinned else 1
            if want == 1:
                return Offer(cands, available, _Singles(free), available)
            whole = [tuple(cands)] if len(free) == len(cands) else []
            return Offer(cands, available, whole, available)
        return Offer(cands, available, self._choices(free, count), self._claim(available, count))

    def placed(self, job: JobSnap, devices: Iterable[str]) -> None:
        given = list(devices)
        self.taken.update(given)
        if self.caps is not None and job.array_id:
            self.caps.placed(job.array_id)
        if self.limited_on:
            self.held[job.share] = self.held.get(job.share, 0) + len(given)

    def blocked(self, job: JobSnap, offer: Offer) -> None:
        claim = offer.claim
        if self.preemption is not None and offer.candidates:
            self.preemption.ranks[job.id] = (job.priority, job.preemptible)
            count = len(offer.candidates) if job.pinned else max(1, job.count)
            stopping = self.preemption.claim(
                job, offer.candidates, count, lambda d: self._usable(job, d)
            )
            claim = claim if stopping is None else stopping
        soft = job.preemptible and self.preemption is not None
        for d in claim:
            self._claim_device(d, job.id, soft)

    def _usable(self, job: JobSnap, device_id: str) -> tuple[str, bool] | None:
        """For preemption: the device's host and whether it is free; None when held out or
        claimed by a job ``job`` does not outrank."""
        if device_id in self._draining_ids or device_id not in self.by_id:
            return None
        owner = self.reserved.get(device_id, job.id)
        if owner != job.id:
            assert self.preemption is not None
            rank = self.preemption.ranks.get(owner)
            if rank is None or not outranks(job, *rank):
                return None
        free = device_id in self._schedulable and device_id not in self.taken
        return self._host(device_id), free

    def reserve(self, device_id: str, job_id: str) -> None:
        """Claim a device for a job unless one ahead already did."""
        if device_id not in self._draining_ids and device_id not in self.reserved:
            self._claim_device(device_id, job_id)

    def claim_unless_free(self, device_id: str, job_id: str) -> bool:
        """``reserve`` unless the device is free; whether it was not free."""
        if device_id in self.reserved:
            return True  # a job ahead claimed it; reserving again changes nothing
        if device_id in self._schedulable and device_id not in self.taken:
            return False
        if device_id not in self._draining_ids:
            self._claim_device(device_id, job_id)
        return True

    def _claim_device(self, device_id: str, job_id: str, soft: bool = False) -> None:
        """``soft``: a preemptible job's claim, which a job it would yield to may take over, so
        the walk goes on past it."""
        counted = device_id in self.reserved and device_id not in self._soft
        if soft:
            self._soft.add(device_id)
        else:
            self._soft.discard(device_id)
        if not soft and not counted and device_id in self._reservable:
            self._claimed += 1
            self.full = self._claimed == len(self._reservable)
        self.reserved[device_id] = job_id

    def _host(self, device_id: str) -> str:
        d = self.by_id.get(device_id)
        return d.host if d is not None else ""

    def _by_host(self, ids: list[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for d in ids:
            out.setdefault(self._host(d), []).append(d)
        return out

    def _choices(self, free: list[str], count: int) -> list[tuple[str, ...]]:
        """N free devices of one host per choice: best fit first, then host name."""
        hosts = [(len(ids), h, ids) for h, ids in self._by_host(free).items() if len(ids) >= count]
        return [tuple(ids[:count]) for _, _, ids in sorted(hosts)]

    def _claim(self, available: list[str], count: int) -> list[str]:
        """The N devices an N-device job waits for, on the host closest to taking it."""
        hosts = []
        for h, ids in self._by_host(available).items():
            if len(ids) < count:
                continue
            ready = [d for d in ids if d in self._schedulable and d not in self.taken]
            hosts.append((-len(ready), -len(ids), h, ready, ids))
        if not hosts:
            return []
        _, _, _, ready, ids = min(hosts)
        rest = [d for d in ids if d not in ready]
        return sorted((ready + rest)[:count])
