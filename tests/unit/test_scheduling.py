"""The scheduling rules on snapshots alone, no database (STORE-056, STORE-060..064, STORE-070).

``plan`` runs the same ``Planner`` the store's pass uses, assuming every assignment it
tries succeeds, so these properties hold for each pass on a snapshot that does not move
under it. Draining devices (EXT-DRAIN-2) and several-device jobs (EXT-GANG-1) are
generated too, although nothing in the store makes them yet.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resource_controller.core import selectors
from resource_controller.core.passloop import Placement, SnapshotQueue, plan, run_pass
from resource_controller.core.planner import Planner
from resource_controller.core.scheduling import (
    DeviceSnap,
    JobSnap,
    candidates,
    competes,
    matching,
    queue_key,
    queue_position,
    tolerates,
)

IDS = [f"h{h}:g{g}" for h in range(2) for g in range(3)]
SELECTORS = ["", "", "kind=a", "kind=b", "kind!=a", "idx>=1", "vendor"]  # "vendor" is bad


@st.composite
def fleets(draw: st.DrawFn) -> list[DeviceSnap]:
    ids = draw(st.lists(st.sampled_from(IDS), unique=True, max_size=len(IDS)))
    return [
        DeviceSnap(
            id=i,
            host=i.split(":")[0],
            state=draw(st.sampled_from(["ready", "ready", "busy", "unknown", "unhealthy"])),
            max_runtime_seconds=draw(st.sampled_from([0, 0, 600])),
            labels={"kind": draw(st.sampled_from("ab")), "idx": i[-1]},
            draining=draw(st.integers(0, 5)) == 0,
        )
        for i in sorted(ids)
    ]


@st.composite
def queues(draw: st.DrawFn, gangs: bool = False) -> list[JobSnap]:
    n = draw(st.integers(0, 10))
    out = []
    for seq in range(1, n + 1):
        pinned = draw(st.integers(0, 2)) == 0
        out.append(
            JobSnap(
                id=f"j{seq}",
                seq=seq,
                priority=draw(st.integers(-1, 1)),
                queued_at=draw(st.integers(0, 2)),
                selector="" if pinned else draw(st.sampled_from(SELECTORS)),
                device_id=draw(st.sampled_from([*IDS, "gone:g0"])) if pinned else "",
                max_runtime_seconds=draw(st.sampled_from([0, 0, 300, 900])),
                count=draw(st.sampled_from([1, 1, 2])) if gangs and not pinned else 1,
            )
        )
    return out


def _cands(job: JobSnap, fleet: list[DeviceSnap]) -> list[str]:
    try:
        return candidates(job, fleet)
    except selectors.SelectorError:
        return []


@settings(max_examples=300)
@given(fleet=fleets(), jobs=queues())
def test_plan_properties(fleet: list[DeviceSnap], jobs: list[JobSnap]) -> None:
    p = plan(jobs, fleet)
    by_id = {d.id: d for d in fleet}
    by_job = {j.id: j for j in jobs}
    order = {j.id: queue_key(j) for j in jobs}
    given_out = [d for devs in p.assignments.values() for d in devs]
    # No device is handed out twice in one pass (STORE-010's intent, before the index).
    assert len(given_out) == len(set(given_out))
    for job_id, devs in p.assignments.items():
        job = by_job[job_id]
        assert len(devs) == 1
        (d,) = devs
        # Only a ready, non-draining device is assigned (STORE-020, EXT-DRAIN-2).
        assert by_id[d].schedulable
        if job.pinned:
            assert d == job.device_id  # a pinned job only gets its device
        else:
            # The selector matches and the ceiling tolerates the runtime (STORE-064).
            sel = selectors.parse(job.selector) if job.selector else None
            assert sel is None or sel.matches(by_id[d].labels)
            assert tolerates(by_id[d], job.max_runtime_seconds)
        # A device reserved for a job ahead is never given to a later one (STORE-062).
        owner = p.reservations.get(d)
        assert owner is None or order[owner] > order[job_id]
    for d, owner in p.reservations.items():
        # A reservation belongs to a job that was not placed and could use the device,
        # and never names a draining device (EXT-DRAIN-2).
        assert owner not in p.assignments
        assert d in _cands(by_job[owner], fleet)
        assert d not in by_id or not by_id[d].draining
    for a in jobs:
        for b in jobs:
            # FIFO: a job placed on a device a job ahead of it could use means that job
            # ahead was placed too (STORE-060, STORE-186).
            if (
                order[a.id] < order[b.id]
                and b.id in p.assignments
                and p.assignments[b.id][0] in _cands(a, fleet)
            ):
                assert a.id in p.assignments, (a, b)
    for job in jobs:
        if job.id in p.assignments or job.id in p.unparsable:
            continue
        # Nothing placeable is left: every usable device was taken or claimed ahead.
        for d in _cands(job, fleet):
            if d in by_id and by_id[d].schedulable:
                owner = p.reservations.get(d)
                assert d in given_out or (owner is not None and order[owner] < order[job.id])
    # The walk stops once every reservable device is claimed: jobs behind are not read.
    unparsable = {j.id for j in jobs if j.selector == "vendor"}
    reservable = {d.id for d in fleet if not d.held_out}
    if reservable and reservable <= p.reservations.keys():
        assert set(p.unparsable) <= unparsable
    else:
        assert set(p.unparsable) == unparsable


@settings(max_examples=200)
@given(fleet=fleets(), jobs=queues(gangs=True))
def test_a_job_asking_for_several_devices_gets_them_on_one_host(
    fleet: list[DeviceSnap], jobs: list[JobSnap]
) -> None:
    p = plan(jobs, fleet)
    by_id = {d.id: d for d in fleet}
    given_out = [d for devs in p.assignments.values() for d in devs]
    assert len(given_out) == len(set(given_out))
    for job_id, devs in p.assignments.items():
        job = next(j for j in jobs if j.id == job_id)
        assert len(devs) == job.count
        assert len({by_id[d].host for d in devs}) == 1
        assert all(by_id[d].schedulable for d in devs)


@given(fleet=fleets(), jobs=queues())
def test_the_plan_does_not_depend_on_the_order_jobs_arrive_in(
    fleet: list[DeviceSnap], jobs: list[JobSnap]
) -> None:
    assert plan(jobs, fleet) == plan(list(reversed(jobs)), fleet)


def test_a_different_queue_order_is_a_different_key() -> None:
    # Room for priority aging (EXT-FAIR-1): the plan takes the order as a key function.
    fleet = [DeviceSnap("h:g0")]
    old = JobSnap("old", seq=1, priority=0, queued_at=0, device_id="h:g0")
    new = JobSnap("new", seq=2, priority=1, queued_at=100, device_id="h:g0")
    assert plan([old, new], fleet).assignments == {"new": ("h:g0",)}

    def aged(j: JobSnap) -> tuple[int, int, int]:
        return (-(j.priority + (200 - j.queued_at) // 100), j.queued_at, j.seq)

    assert plan([old, new], fleet, key=aged).assignments == {"old": ("h:g0",)}
    assert queue_position(old, [old, new], key=aged) == 1


def test_a_draining_device_is_matched_but_never_assigned_or_reserved() -> None:
    fleet = [DeviceSnap("h:g0", draining=True), DeviceSnap("h:g1", state="busy")]
    pinned = JobSnap("p", seq=1, device_id="h:g0")
    broad = JobSnap("b", seq=2)
    assert [d.id for d in matching(None, fleet)] == ["h:g0", "h:g1"]
    p = plan([pinned, broad], fleet)
    assert p.assignments == {}
    assert p.reservations == {"h:g1": "b"}
    planner = Planner(fleet)
    planner.reserve("h:g0", "p")
    assert planner.reserved == {}


def test_blocked_job_claims_all_its_unclaimed_candidates() -> None:
    # STORE-062: the head job claims both busy devices; a narrower job behind it is
    # pruned of them and takes the free one only.
    fleet = [
        DeviceSnap("h:g0", state="busy", labels={"kind": "a"}),
        DeviceSnap("h:g1", state="busy", labels={"kind": "a"}),
        DeviceSnap("h:g2", labels={"kind": "b"}),
    ]
    head = JobSnap("head", seq=1, selector="kind=a")
    narrow = JobSnap("narrow", seq=2, device_id="h:g1")
    anyone = JobSnap("any", seq=3)
    p = plan([head, narrow, anyone], fleet)
    assert p.assignments == {"any": ("h:g2",)}
    assert p.reservations == {"h:g0": "head", "h:g1": "head"}


def test_ceilings_filter_selector_jobs_but_not_pinned_ones() -> None:
    fleet = [DeviceSnap("h:g0", max_runtime_seconds=600), DeviceSnap("h:g1", max_runtime_seconds=0)]
    long = JobSnap("long", seq=1, max_runtime_seconds=900)
    pinned_long = JobSnap("pinned", seq=2, device_id="h:g0", max_runtime_seconds=900)
    assert candidates(long, fleet) == ["h:g1"]
    assert candidates(pinned_long, fleet) == ["h:g0"]  # STORE-064


def ahead(a: JobSnap, b: JobSnap) -> bool:
    """STORE-070's "ahead", written out: higher priority, or equal priority and earlier
    ``queued_at``, or both equal and smaller ``seq``."""
    if a.priority != b.priority:
        return a.priority > b.priority
    if a.queued_at != b.queued_at:
        return a.queued_at < b.queued_at
    return a.seq < b.seq


@given(jobs=queues())
def test_queue_order_and_positions(jobs: list[JobSnap]) -> None:
    ordered = sorted(jobs, key=queue_key)
    for i, a in enumerate(ordered):
        assert all(ahead(a, b) for b in ordered[i + 1 :])  # STORE-060
    for job in jobs:
        others = [o for o in jobs if ahead(o, job)]
        if job.pinned:  # only jobs pinned to the same device count
            others = [o for o in others if o.pinned and o.device_id == job.device_id]
        assert queue_position(job, jobs) == 1 + len(others)


def test_explain_counts_competitors_ceilings_aside() -> None:
    fleet = [DeviceSnap("h:g0", max_runtime_seconds=60, labels={"kind": "a"}), DeviceSnap("h:g1")]
    assert competes(
        JobSnap("j", seq=1, selector="kind=a", max_runtime_seconds=900), {"h:g0"}, fleet
    )
    assert competes(JobSnap("j", seq=1, device_id="h:g0"), {"h:g0"}, fleet)
    assert not competes(JobSnap("j", seq=1, device_id="h:g1"), {"h:g0"}, fleet)
    assert not competes(JobSnap("j", seq=1, selector="vendor"), {"h:g0"}, fleet)


@settings(max_examples=300, deadline=None)
@given(fleet=fleets(), jobs=queues(gangs=True), vanished=st.booleans())
def test_the_planner_keeps_saturation_and_candidates_as_the_rules_define_them(
    fleet: list[DeviceSnap], jobs: list[JobSnap], vanished: bool
) -> None:
    """``saturated`` is kept as the pass goes and candidates are reused per ask; after
    every step both still equal the rule computed from scratch on the snapshot."""
    planner = Planner(list(reversed(fleet)))  # the planner orders the snapshot itself
    reservable = {d.id for d in fleet if not d.draining}
    for job in sorted(jobs, key=queue_key):
        try:
            offer = planner.offer(job)
        except selectors.SelectorError:
            continue
        assert offer.candidates == candidates(job, fleet)
        if offer.choices:
            planner.placed(job, offer.choices[0])
        else:
            planner.blocked(job, offer)
        if vanished:
            planner.reserve("gone:g0", job.id)  # a device with no row is never reservable
        expected = bool(reservable) and reservable <= planner.reserved.keys()
        assert planner.saturated() == expected


@settings(max_examples=200)
@given(fleet=fleets(), queue=queues())
def test_claim_unless_free_is_what_a_one_device_pins_offer_would_do(
    fleet: list[DeviceSnap], queue: list[JobSnap]
) -> None:
    """``run_pass`` claims a one-device pin's busy device through ``claim_unless_free``
    without building its offer; the pass must end as if every job's offer were built."""

    class EveryOffer(SnapshotQueue):
        def __iter__(self) -> Iterator[Sequence[Any]]:
            for entry in super().__iter__():
                yield (entry[0], entry[1], False, entry[3])

    def place(job: JobSnap, choice: tuple[str, ...]) -> Placement:
        return Placement.PLACED

    by_offer, by_shortcut = Planner(fleet), Planner(fleet)
    slow = run_pass(EveryOffer(queue, queue_key, by_offer.by_id), by_offer, place)
    fast = run_pass(SnapshotQueue(queue, queue_key, by_shortcut.by_id), by_shortcut, place)
    assert fast == slow
    assert by_shortcut.taken == by_offer.taken
    assert by_shortcut.saturated() == by_offer.saturated()


def test_one_device_choices_are_made_as_asked_and_equal_their_list() -> None:
    """A job for any device gets its choices lazily (10,000 candidates, one tried); they
    read as the list of one-device tuples they stand for."""
    from resource_controller.core.planner import _Singles

    free = ["h:g0", "h:g1", "h:g2"]
    lazy = _Singles(free)
    assert lazy == [("h:g0",), ("h:g1",), ("h:g2",)] and lazy != [("h:g0",)]
    assert len(lazy) == 3 and lazy[0] == ("h:g0",) and lazy[-1] == ("h:g2",)
    assert lazy[1:] == [("h:g1",), ("h:g2",)] and list(lazy) == [(d,) for d in free]
    assert not _Singles([]) and _Singles([]) == []
    with pytest.raises(IndexError):
        lazy[3]


def test_could_ever_fit_counts_per_host() -> None:
    from resource_controller.core.scheduling import DeviceSnap, could_ever_fit

    def snap(host: str, name: str) -> DeviceSnap:
        return DeviceSnap(id=f"{host}:{name}", host=host, state="ready")

    spread = [snap("a", "g0"), snap("b", "g0"), snap("c", "g0")]
    assert could_ever_fit(1, spread) and not could_ever_fit(2, spread)
    assert could_ever_fit(2, [*spread, snap("b", "g1")])
    assert not could_ever_fit(1, [])
