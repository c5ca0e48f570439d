"""Why a queued job waits, on snapshots alone, no database (EXT-WHY-1, EXT-WHY-1a, EXT-WHY-2)."""

from __future__ import annotations

import calendar
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from resource_controller.core import selectors, waiting
from resource_controller.core.passloop import plan
from resource_controller.core.scheduling import DeviceSnap, JobSnap, candidates, queue_key
from resource_controller.core.waiting import Blocker, Holding, WaitFacts

IDS = [f"h{h}:g{g}" for h in range(2) for g in range(3)]
SELECTORS = ["", "", "kind=a", "kind=b", "idx>=1", "vendor"]  # "vendor" no longer parses


@st.composite
def fleets(draw: st.DrawFn) -> list[DeviceSnap]:
    ids = draw(st.lists(st.sampled_from(IDS), unique=True, max_size=len(IDS)))
    return [
        DeviceSnap(
            id=i,
            host=i.split(":")[0],
            state=draw(st.sampled_from(["ready", "busy", "busy", "unknown", "unhealthy"])),
            max_runtime_seconds=draw(st.sampled_from([0, 0, 600])),
            labels={"kind": draw(st.sampled_from("ab")), "idx": i[-1]},
            draining=draw(st.integers(0, 5)) == 0,
        )
        for i in sorted(ids, reverse=True)  # the rules sort; the snapshot need not
    ]


@st.composite
def queues(draw: st.DrawFn) -> list[JobSnap]:
    out = []
    for seq in range(1, draw(st.integers(0, 8)) + 1):
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
            )
        )
    return out


@st.composite
def snapshots(draw: st.DrawFn) -> WaitFacts:
    fleet = draw(fleets())
    queued = draw(queues())
    leases = [
        Holding(
            device_id=d.id,
            holder=draw(st.sampled_from(["alice", "bob"])),
            job_id=draw(st.sampled_from(["", f"run-{d.id}"])),
            kind=draw(st.sampled_from(["job", "hold"])),
            reason=draw(st.sampled_from(["", "profiling"])),
            acquired_at=draw(st.integers(0, 100)),
            expires_at=1000,
            runtime=draw(st.sampled_from([None, 0, 60])),
        )
        for d in fleet
        if d.state == "busy" or (d.state != "ready" and draw(st.booleans()))
    ]
    # Reservation rows as a pass writes them, or stale ones naming any job at all.
    if draw(st.booleans()):
        reservations = plan(queued, fleet).reservations
    else:
        names = [j.id for j in queued] + ["left-the-queue"]  # never empty
        reservations = {d.id: draw(st.sampled_from(names)) for d in fleet if draw(st.booleans())}
    quarantine = {d.id: f"why {d.id}" for d in fleet if d.state == "unhealthy"}
    return WaitFacts(fleet, queued, leases, reservations, quarantine)


def _cands(job: JobSnap, fleet: list[DeviceSnap]) -> list[str]:
    try:
        return candidates(job, fleet)
    except selectors.SelectorError:
        return []


@settings(max_examples=300)
@given(snap=snapshots())
def test_one_entry_per_candidate_and_each_fact_exactly_when_it_holds(snap: WaitFacts) -> None:
    devices = {d.id: d for d in snap.devices}
    leases = {h.device_id: h for h in snap.leases}
    order = {j.id: queue_key(j) for j in snap.queued}
    every = waiting.waiting_for_all(snap)
    assert every.keys() == {j.id for j in snap.queued}
    for job in snap.queued:
        entries = every[job.id]
        assert entries == waiting.waiting_for(job, snap)
        ids = [e.device_id for e in entries]
        assert ids == sorted(set(_cands(job, list(snap.devices))))  # by device ID, no repeats
        for e in entries:
            lease = leases.get(e.device_id)
            held = (e.holder, e.job_id, e.kind, e.reason, e.since, e.until)
            if lease is None:
                assert held == ("", "", "", "", None, None)
            else:
                assert held == (
                    lease.holder,
                    lease.job_id,
                    lease.kind,
                    lease.reason,
                    lease.acquired_at,
                    lease.until,
                )
            reserver = snap.reservations.get(e.device_id, "")
            ahead = reserver in order and reserver != job.id and order[reserver] < order[job.id]
            assert e.reserved_by == (reserver if ahead else "")
            d = devices.get(e.device_id)
            out = d is not None and d.state in ("unknown", "unhealthy")
            assert e.state == (d.state if d is not None and out else "")
            unhealthy = d is not None and d.state == "unhealthy"
            assert e.quarantine_reason == (f"why {e.device_id}" if unhealthy else "")
            assert e.draining == (d is not None and d.draining)


@settings(max_examples=200)
@given(fleet=fleets(), queued=queues())
def test_a_job_is_never_blocked_by_its_own_reservation(
    fleet: list[DeviceSnap], queued: list[JobSnap]
) -> None:
    # After the pass: the placed jobs left the queue, the rest wait with its rows.
    p = plan(queued, fleet)
    reservations = p.reservations
    left = [j for j in queued if j.id not in p.assignments]
    every = waiting.waiting_for_all(WaitFacts(fleet, left, reservations=reservations))
    for job in left:
        for e in every[job.id]:
            assert e.reserved_by != job.id
            if reservations.get(e.device_id) not in (None, job.id):
                # STORE-062: only a job ahead claims a device in a pass.
                assert e.reserved_by == reservations[e.device_id]


def test_held_reserved_and_out_of_pool_for_a_selector_job() -> None:
    fleet = [
        DeviceSnap("box:gpu2", "box", "unhealthy", labels={"gpu": "a"}),
        DeviceSnap("box:gpu0", "box", "busy", labels={"gpu": "a"}),
        DeviceSnap("box:gpu1", "box", "ready", labels={"gpu": "a"}),
        DeviceSnap("box:gpu3", "box", "ready", labels={"gpu": "b"}),  # not matched
        DeviceSnap("box:gpu4", "box", "unknown", labels={"gpu": "a"}, draining=True),
    ]
    head = JobSnap("head", 1, device_id="box:gpu1")
    job = JobSnap("sel", 2, selector="gpu=a")
    snap = WaitFacts(
        fleet,
        [head, job],
        [Holding("box:gpu0", "alice", "j0", "hold", "profiling", 100, 1000, 600)],
        {"box:gpu1": "head", "box:gpu2": "sel"},
        {"box:gpu2": "fan stuck"},
    )
    assert waiting.waiting_for(job, snap) == [
        Blocker("box:gpu0", "alice", "j0", "hold", "profiling", since=100, until=700),
        Blocker("box:gpu1", reserved_by="head"),
        Blocker("box:gpu2", state="unhealthy", quarantine_reason="fan stuck"),
        Blocker("box:gpu4", state="unknown", draining=True),
    ]


def test_any_device_job_waits_for_every_device_ceiling_filtered() -> None:
    # EXT-CLI-1a: candidates are every device whose ceiling tolerates the job.
    fleet = [DeviceSnap("b:1", max_runtime_seconds=60), DeviceSnap("a:0"), DeviceSnap("c:2")]
    job = JobSnap("any", 1, max_runtime_seconds=600)
    got = waiting.waiting_for(job, WaitFacts(fleet, [job]))
    assert [b.device_id for b in got] == ["a:0", "c:2"]


def test_a_selector_that_no_longer_parses_waits_for_nothing() -> None:
    job = JobSnap("bad", 1, selector="vendor")
    assert waiting.waiting_for(job, WaitFacts([DeviceSnap("a:0")], [job])) == []


def test_until_is_the_runtime_from_the_grant_none_without_one_expiry_without_a_job() -> None:
    assert Holding("d", "a", "j", acquired_at=100, expires_at=999, runtime=600).until == 700
    assert Holding("d", "a", "j", acquired_at=100, expires_at=999, runtime=0).until is None
    assert Holding("d", "a", "", acquired_at=100, expires_at=999, runtime=None).until == 999


# ---- words (EXT-WHY-2) -----------------------------------------------------------------

NOW = calendar.timegm(time.strptime("2026-08-13T14:12:00Z", "%Y-%m-%dT%H:%M:%SZ"))


def test_the_spec_example_reads_as_written() -> None:
    b = Blocker(
        "box:gpu0",
        holder="alice",
        job_id="1b2c3d4e-0000-4000-8000-000000000000",
        kind="hold",
        reason="profiling",
        since=NOW - 720,
        until=NOW + 18 * 60,
    )
    assert waiting.summary([b], NOW, pinned=True) == (
        'held by alice (job 1b2c3d4e…, hold "profiling") for 12m0s,'
        " at most until 2026-08-13T14:30:00Z"
    )
    assert waiting.cell([b], pinned=True) == 'alice (hold "profiling")'


def test_out_of_pool_says_the_state_the_reason_and_who_can_clear_it() -> None:
    b = Blocker("box:gpu0", state="unhealthy", quarantine_reason="verify failed")
    text = waiting.phrase(b, NOW)
    assert text.startswith("box:gpu0 out of the pool: unhealthy (verify failed)")
    assert "operator" in text and "rc clear box:gpu0" in text
    unknown = waiting.phrase(Blocker("box:gpu1", state="unknown"), NOW, with_device=False)
    assert unknown.startswith("out of the pool: unknown") and "rc clear" not in unknown
    assert waiting.cell([b], pinned=True) == "unhealthy: verify failed"


def test_several_devices_are_named_each_then_how_many_more() -> None:
    blockers = [Blocker(f"h:{i}", reserved_by="9d1c8a44-aaaa") for i in range(5)]
    text = waiting.summary(blockers, NOW, pinned=False)
    assert text.count("reserved by job 9d1c8a44…, queued ahead") == waiting.SHOWN
    assert text.startswith("h:0 reserved by") and text.endswith("and 2 more")
    assert waiting.cell(blockers, pinned=False) == (
        "h:0 reserved by 9d1c8a44…; h:1 reserved by 9d1c8a44…; +3 more"
    )
    held_too = Blocker("h:0", holder="bob", job_id="j", kind="job", since=NOW, reserved_by="x")
    assert waiting.phrase(held_too, NOW) == (
        "h:0 held by bob (job j) for 0s, then next in line is job x, queued ahead"
    )


# ---- MIG conflicts (EXT-MIG-3) ---------------------------------------------------------


def test_a_device_in_mig_conflict_is_held_out_and_says_why() -> None:
    why = "GPU 0 is in MIG mode"
    fleet = [
        DeviceSnap("box:gpu0", "box", "ready", labels={"v": "n"}, mig_conflict=why),
        DeviceSnap("box:gpu0.mig0", "box", "ready", labels={"v": "n"}),
    ]
    assert not fleet[0].schedulable and fleet[0].held_out and fleet[1].schedulable
    pinned = JobSnap("pin", 1, device_id="box:gpu0")
    sel = JobSnap("sel", 2, selector="v=n")
    p = plan([pinned, sel], fleet)
    # The pinned job waits, reserving nothing; the selector job takes the instance.
    assert p.assignments == {"sel": ("box:gpu0.mig0",)} and p.reservations == {}
    (blocker,) = waiting.waiting_for(pinned, WaitFacts(fleet, [pinned]))
    assert blocker == Blocker("box:gpu0", mig_conflict=why)
    said = waiting.phrase(blocker, NOW, with_device=False)
    assert said == f"not offered: MIG conflict ({why})"
    assert waiting.cell([blocker], pinned=True) == "mig conflict"
    wire = {"device_id": "box:gpu0", "mig_conflict": why}
    assert waiting.from_wire(wire) == blocker
