"""Who may run where, in what order, and who waits for what: pure functions over snapshots.

The one copy of each scheduling rule, used by enqueue (the submit-time check), the
scheduling pass, explain and queue positions:

- queue order as a key function, so a different order (priority aging) is a different key, not a rewrite;
- the candidate rule: a pinned job may use
  its device; a selector job, or a job with neither (any device), the devices its
  selector matches in any state, filtered by their runtime ceilings;
- reservation planning: ``Planner`` takes one job at a time in
  queue order and says which devices to try and which to claim when none of them can
  be had. The pass that walks a queue and asks it is ``core.passloop.run_pass``.

Several devices per job: a job carries a device ``count`` (N devices
on ONE host) and, when pinned to a list, its ``device_ids``. A choice is then N devices
of one host, and a blocked N-device job claims devices on one host only (``Offer.claim``):

- placing: hosts with at least N free candidates are tried best fit first (fewest free
  candidates, then host name), each with its N lowest-ID free devices, so a small job
  leaves the hosts with the most room to the bigger ones;
- waiting: the host is the one where the job is closest to starting: the most free
  (``ready``) unclaimed candidates, then the most unclaimed candidates, then host name;
  only hosts with at least N unclaimed candidates count (none: it claims nothing). On it
  the job claims N devices: its free ones first, then by ID. Reservations are rebuilt
  every pass with the head job first, so each device that frees on that host goes to
  it until it has N, and a stream of 1-device jobs behind it cannot starve it; the
  other hosts, and the devices it does not need, stay open to the jobs behind.

A device carries a ``draining`` flag (EXT-DRAIN-2: still matched and pinnable, never
assigned or reserved), and a device whose name conflicts with its GPU's MIG mode (the
``mig_conflict`` label) is held out the same way.

A fair share between people:

- submitter limits (``SubmitterLimits``): a job whose submitter already holds so many
  devices that this job's would pass the limit is neither placed nor claims anything,
  so the jobs of other people behind it are placed (no head-of-line blocking across
  people); holds and every device of a gang count, devices placed earlier in the same
  pass included;
- dependencies: a job waiting for other jobs to end (``JobSnap.after_open``) takes no
  part in a pass at all; ``dependency_met`` says whether an ended job lets it go on.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from resource_controller.core import selectors
from resource_controller.core.share import NO_LIMITS, SubmitterLimits, over_limit
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
        """Never assigned or reserved, though still matched and pinnable: draining
        or in MIG conflict."""
        return self.draining or bool(self.mig_conflict)

    @property
    def schedulable(self) -> bool:
        """May be assigned now: ``ready`` and not held out."""
        return self.state == _READY and not self.held_out


_BY_ID = operator.attrgetter("id")

#: As a plain string: comparing with the enum member costs four times as much, and a
#: pass asks it per device of every queued job's choices.
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
    #: The name its submitter limit counts it under: the named token's
    #: name where EXT-WHO applies, else the recorded submitter.
    share: str = ""
    #: Jobs it still waits for; above 0 it is not eligible for a pass.
    after_open: int = 0

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
    """EXT-FAIR-1: ``priority`` plus one per whole ``aging`` seconds waited since
    ``queued_at``, capped at ``PRIORITY_MAX``; ``aging`` <= 0 is no aging.

    A priority already at or above the top is left as it is (aging only ever raises),
    and a clock behind ``queued_at`` ages nothing. ``queries.effective_priority_sql``
    is this rule in SQL; a test holds the two together.
    """
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


def effective_runtime(requested: int, ceiling: int) -> int:
    """A job that asked for no runtime inherits the device's ceiling.

    Only a positive request is a runtime of its own: a stored negative one (from before
    EXT-LIMITS-1 refused it) must not escape the ceiling either.
    """
    return requested if requested > 0 else ceiling


def matching(
    selector: selectors.Selector | None, devices: Iterable[DeviceSnap]
) -> list[DeviceSnap]:
    """Devices in any state whose labels satisfy ``selector``, by ID; None = every device."""
    found = (d for d in devices if selector is None or selector.matches(d.labels))
    return sorted(found, key=_BY_ID)


def _parsed(job: JobSnap) -> selectors.Selector | None:
    return selectors.parse(job.selector) if job.selector else None


def eligible(job: JobSnap, devices: Iterable[DeviceSnap]) -> list[str]:
    """Devices the job competes for, ceilings aside: its pin, or what its selector matches.

    Raises ``SelectorError`` for a stored selector that no longer parses.
    """
    if job.pinned:
        return job.pins
    return [d.id for d in matching(_parsed(job), devices)]


def candidates(job: JobSnap, devices: Iterable[DeviceSnap]) -> list[str]:
    """Devices the job may be placed on, in the order to try them.

    Pinned: its device, never ceiling-filtered at schedule time (the ceiling was
    applied at enqueue). Otherwise the matching devices whose ceiling tolerates the
    job's runtime, the same rule enqueue used. Raises ``SelectorError``.
    """
    if job.pinned:
        return job.pins
    return [d.id for d in matching(_parsed(job), devices) if tolerates(d, job.max_runtime_seconds)]


def gang_runtime(requested: int, ceilings: Iterable[int]) -> int:
    """The runtime of a job on several devices: the smallest declared ceiling wins.

    A job that asked for none inherits the smallest positive ceiling among them (0 when
    none has one), as a one-device job inherits its device's.
    """
    declared = [c for c in ceilings if c > 0]
    return effective_runtime(requested, min(declared) if declared else 0)


def could_ever_fit(count: int, devices: Iterable[DeviceSnap]) -> bool:
    """Some single host has at least ``count`` of ``devices`` (EXT-GANG-2's submit check).

    Stops at the first host that has them: every submit asks, and for one device the
    first device answers, where counting a fleet of 10,000 was most of a submit.
    """
    per_host: dict[str, int] = {}
    for d in devices:
        n = per_host[d.host] = per_host.get(d.host, 0) + 1
        if n >= count:
            return True
    return False


def competes(job: JobSnap, device_ids: set[str], devices: Iterable[DeviceSnap]) -> bool:
    """The job waits for one of ``device_ids`` (explain's queue depth).

    A stored selector that no longer parses competes for nothing.
    """
    try:
        return any(d in device_ids for d in eligible(job, devices))
    except selectors.SelectorError:
        return False


def queue_position(job: JobSnap, queued: Iterable[JobSnap], key: QueueKey = queue_key) -> int:
    """1-based position of queued ``job`` among ``queued``.

    Pinned: 1 + the jobs pinned to the same device ahead of it. Otherwise 1 + every
    queued job ahead of it (an upper bound: its candidates can change between passes).
    """
    mine = key(job)
    ahead = (o for o in queued if o.id != job.id and key(o) < mine)
    if job.pinned:
        pins = set(job.pins)
        ahead = (o for o in ahead if o.pinned and not pins.isdisjoint(o.pins))
    return 1 + sum(1 for _ in ahead)


@dataclass(frozen=True)
class Offer:
    """What one job may do in this pass."""

    candidates: list[str]  #: every device it may use
    available: list[str]  #: candidates not claimed by a job ahead of it, nor draining
    choices: Sequence[tuple[str, ...]]  #: device sets to try, in order (each ``count`` long)
    #: What it claims if none of its choices can be had: every available candidate for a
    #: one-device job; N devices of one host for an N-device job.
    claim: list[str] = field(default_factory=list)
    #: The submitter limit that keeps it waiting: it has no choices and
    #: claims nothing; None when no limit stands in its way.
    limit: int | None = None


class _Singles(Sequence[tuple[str, ...]]):
    """The one-device choices over ``free`` devices, each made when it is asked for: a
    job for any device of 10,000 has 10,000 choices, and the pass almost always takes
    the first. Equal to the list of the same choices."""

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
    """A fleet's snapshots by ID with the sets ``Planner`` asks of each device, and the
    candidates found per (selector, runtime).

    Built from the snapshots, or kept by the store between passes and updated for the
    devices that changed (``store/fleet.py``): rebuilt per pass it was a third of a
    submit's CPU at 10,000 devices. ``Planner`` only reads it, but for ``matches``,
    which it fills; candidates depend on labels, ceilings and the set of devices, never
    on states, so a grant or a release keeps them.
    """

    def __init__(self, devices: Sequence[DeviceSnap]) -> None:
        self.devices: Sequence[DeviceSnap] = sorted(devices, key=_BY_ID)
        self.by_id = {d.id: d for d in self.devices}
        self.schedulable = {d.id for d in self.devices if d.schedulable}
        #: Held out: draining or in MIG conflict (``DeviceSnap.held_out``).
        self.draining = {d.id for d in self.devices if d.held_out}
        self.reservable = {d.id for d in self.devices if not d.held_out}
        self.matches: dict[tuple[str, int], list[str]] = {}

    def update(
        self, ordered: Sequence[DeviceSnap], changed: Iterable[DeviceSnap], removed: Iterable[str]
    ) -> None:
        """The fleet is now ``ordered`` (by ID): ``changed`` are new or changed
        snapshots, ``removed`` the IDs that are gone."""
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
    """The decisions of one scheduling pass, one job at a time.

    Call ``offer`` for each job in queue order; then ``placed`` when one of its choices
    was assigned, ``blocked`` when none could be (it then claims all its available
    candidates for the rest of the pass), or neither when the job turned out to have
    left the queue (it claims nothing) or its offer named a submitter limit.

    ``limits`` and ``held`` (devices held per share name when the pass began) are the
    submitter limits; what the pass places is added to ``held`` as it goes.
    """

    def __init__(
        self,
        devices: Sequence[DeviceSnap] | FleetIndex,
        limits: SubmitterLimits = NO_LIMITS,
        held: Mapping[str, int] | None = None,
    ) -> None:
        fleet = devices if isinstance(devices, FleetIndex) else FleetIndex(devices)
        self.limits = limits
        #: Whether any limit applies: when not, no job pays for asking.
        self.limited_on = limits.on
        #: Devices held per share name, those placed in this pass included.
        self.held: dict[str, int] = dict(held or {})
        self.devices = fleet.devices
        self.by_id = fleet.by_id
        # What ``offer`` asks of each candidate, as sets (the fleet's, read only): a
        # submit for any device walks the fleet's candidates, and a lookup and a method
        # call each was most of it.
        self._schedulable = fleet.schedulable
        self._draining_ids = fleet.draining
        self.reserved: dict[str, str] = {}  #: device -> the job claiming it for this pass
        self.taken: set[str] = set()  #: devices assigned in this pass
        # What ``saturated`` compares, kept as the pass goes: asked once per queued job,
        # it must not walk the fleet each time (10,000 jobs x 10,000 devices).
        self._reservable = fleet.reservable
        self._claimed = 0  #: reservable devices in ``reserved``
        #: ``saturated()``, kept as claims are made: the pass reads it per queued row.
        self.full = False
        #: Candidates per (selector, runtime): a queue is mostly a few distinct asks.
        self._matches = fleet.matches

    def saturated(self) -> bool:
        """Every device that could ever be reserved is claimed: no job further back can
        be placed on an existing device."""
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
        return found

    def limited(self, share: str, count: int) -> int | None:
        """The submitter limit that keeps a job of ``share`` asking for ``count`` devices
        waiting now; None when none does."""
        if not self.limited_on:
            return None
        return over_limit(self.limits, self.held, share, count)

    def offer(self, job: JobSnap) -> Offer:
        """The job's candidates, the unclaimed ones, and the device sets to try; a job its
        submitter limit keeps waiting gets none of them and claims nothing.

        Raises ``SelectorError`` when its selector no longer parses.
        """
        count = max(1, job.count)
        if self.limited_on:
            limit = over_limit(self.limits, self.held, job.share, count)
            if limit is not None:
                return Offer([], [], (), [], limit)
        cands = self._candidates(job)
        reserved, draining = self.reserved, self._draining_ids
        available = [d for d in cands if d not in reserved and d not in draining]
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
        if self.limited_on:
            self.held[job.share] = self.held.get(job.share, 0) + len(given)

    def blocked(self, job: JobSnap, offer: Offer) -> None:
        for d in offer.claim:
            self._claim_device(d, job.id)

    def reserve(self, device_id: str, job_id: str) -> None:
        """Claim a device for a job unless one ahead already did."""
        if not self._draining(device_id) and device_id not in self.reserved:
            self._claim_device(device_id, job_id)

    def claim_unless_free(self, device_id: str, job_id: str) -> bool:
        """``reserve`` unless the device is free (``ready``, not draining, neither claimed
        nor taken in this pass: what ``offer`` puts in a one-device job's choices);
        whether it was not free. A long pinned queue asks it per job."""
        if device_id in self.reserved:
            return True  # a job ahead claimed it; reserving again changes nothing
        if device_id in self._schedulable and device_id not in self.taken:
            return False
        if device_id not in self._draining_ids:
            self._claim_device(device_id, job_id)
        return True

    def _claim_device(self, device_id: str, job_id: str) -> None:
        if device_id not in self.reserved and device_id in self._reservable:
            self._claimed += 1
            self.full = self._claimed == len(self._reservable)
        self.reserved[device_id] = job_id

    def _ready(self, device_id: str) -> bool:
        return device_id in self._schedulable

    def _draining(self, device_id: str) -> bool:
        return device_id in self._draining_ids

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
            ready = [d for d in ids if self._ready(d) and d not in self.taken]
            hosts.append((-len(ready), -len(ids), h, ready, ids))
        if not hosts:
            return []
        _, _, _, ready, ids = min(hosts)
        rest = [d for d in ids if d not in ready]
        return sorted((ready + rest)[:count])
