"""The planner's rules for several-device jobs, on snapshots alone (EXT-GANG-1..3).

The one-pass cases check which host a job is placed on and which devices a blocked
one claims. The multi-pass cases drive passes on an injected clock: one-device jobs end
at their deadlines and a steady stream of new ones arrives each pass, and the N-device
job at the head must start at the first pass that sees N devices of its host freed.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from resource_controller.clock import FakeClock
from resource_controller.core.passloop import plan
from resource_controller.core.planner import Planner
from resource_controller.core.scheduling import (
    DeviceSnap,
    JobSnap,
    could_ever_fit,
    gang_runtime,
    queue_position,
)


def _host(name: str, n: int, busy: set[int] | None = None) -> list[DeviceSnap]:
    """Devices ``name:g0..`` of one host; those in ``busy`` are busy, the rest ready."""
    return [
        DeviceSnap(f"{name}:g{i}", host=name, state="busy" if i in (busy or set()) else "ready")
        for i in range(n)
    ]


def test_placed_on_the_best_fitting_host_with_its_lowest_free_ids() -> None:
    fleet = _host("a", 4) + _host("b", 3, busy={0})
    p = plan([JobSnap("g", seq=1, count=2)], fleet)
    # b has exactly two free (g1, g2), a has four: b fits best, a stays whole.
    assert p.assignments == {"g": ("b:g1", "b:g2")}


def test_a_blocked_gang_claims_n_devices_of_one_host_free_ones_first() -> None:
    fleet = _host("a", 4, busy={0, 1, 3}) + _host("b", 2, busy={0, 1})
    gang = JobSnap("g", seq=1, count=2)
    single = JobSnap("s", seq=2)
    p = plan([gang, single], fleet)
    # a has one free device (g2): the gang claims it and the lowest busy one, on a only.
    assert {d for d, j in p.reservations.items() if j == "g"} == {"a:g2", "a:g0"}
    assert p.assignments == {}  # nothing free is left for the job behind
    # The other host and the devices the gang does not need stay open to jobs behind.
    fleet2 = _host("a", 4, busy={0, 1, 3}) + _host("b", 2, busy={0})
    p2 = plan([gang, single], fleet2)
    assert {d for d, j in p2.reservations.items() if j == "g"} == {"a:g2", "a:g0"}
    assert p2.assignments == {"s": ("b:g1",)}


def test_the_waiting_host_is_the_closest_to_starting_then_the_largest_then_by_name() -> None:
    gang = JobSnap("g", seq=1, count=3)
    # a: 1 free of 4; b: 2 free of 3 -> b (most free).
    fleet = _host("a", 4, busy={0, 1, 2}) + _host("b", 3, busy={0})
    assert set(plan([gang], fleet).reservations) == {"b:g0", "b:g1", "b:g2"}
    # Equal free: the host with more candidates; then the name.
    fleet = _host("a", 3, busy={0, 1, 2}) + _host("b", 4, busy={0, 1, 2, 3})
    assert set(plan([gang], fleet).reservations) == {"b:g0", "b:g1", "b:g2"}
    fleet = _host("b", 3, busy={0, 1, 2}) + _host("a", 3, busy={0, 1, 2})
    assert set(plan([gang], fleet).reservations) == {"a:g0", "a:g1", "a:g2"}


def test_a_host_with_too_few_unclaimed_devices_is_not_waited_on() -> None:
    fleet = _host("a", 2, busy={0, 1})
    head = JobSnap("head", seq=1, device_id="a:g0")  # claims a:g0
    gang = JobSnap("g", seq=2, count=2)
    p = plan([head, gang], fleet)
    assert p.reservations == {"a:g0": "head"}  # one unclaimed device: the gang claims none


def test_a_pinned_list_is_one_choice_and_claims_all_of_it() -> None:
    fleet = _host("a", 3, busy={2})
    whole = JobSnap("w", seq=1, device_id="a:g0", device_ids=("a:g0", "a:g1"), count=2)
    assert plan([whole], fleet).assignments == {"w": ("a:g0", "a:g1")}
    part = JobSnap("p", seq=1, device_id="a:g1", device_ids=("a:g1", "a:g2"), count=2)
    behind = JobSnap("b", seq=2)
    p = plan([part, behind], fleet)
    assert p.reservations == {"a:g1": "p", "a:g2": "p"}
    assert p.assignments == {"b": ("a:g0",)}
    # Queue positions count the jobs pinned to any of its devices (STORE-070).
    one = JobSnap("o", seq=0, device_id="a:g2")
    assert queue_position(part, [one, part]) == 2


def test_submit_time_helpers() -> None:
    fleet = _host("a", 2) + _host("b", 3)
    assert could_ever_fit(3, fleet) and not could_ever_fit(4, fleet)
    assert gang_runtime(0, [600, 0, 300]) == 300  # EXT-GANG-5: the smallest ceiling
    assert gang_runtime(0, [0, 0]) == 0
    assert gang_runtime(100, [600, 300]) == 100


def _simulate(
    ends: list[int], stream_runtime: int, count: int, pass_every: int = 1, limit: int = 200
) -> tuple[int, float]:
    """Passes and clock seconds until the gang starts, one host of ``len(ends)`` devices.

    Each device runs a one-device job ending at ``ends[i]``; each pass first ends the
    jobs whose time has come, then a new one-device job joins the queue behind the
    gang, then the pass runs and the jobs it placed start running for
    ``stream_runtime`` seconds.
    """
    clock = FakeClock(0.0)
    running = {f"h:g{i}": end for i, end in enumerate(ends)}
    queue = [JobSnap("gang", seq=0, count=count)]
    for n in range(1, limit + 1):
        now = clock.now()
        running = {d: end for d, end in running.items() if end > now}
        queue.append(JobSnap(f"s{n}", seq=n))
        fleet = [
            DeviceSnap(f"h:g{i}", host="h", state="busy" if f"h:g{i}" in running else "ready")
            for i in range(len(ends))
        ]
        placed = plan(queue, fleet).assignments
        for job_id, devices in placed.items():
            if job_id == "gang":
                return n, now
            running.update({d: int(now) + stream_runtime for d in devices})
        queue = [j for j in queue if j.id not in placed]
        clock.advance(pass_every)
    raise AssertionError(f"the gang did not start within {limit} passes")


@settings(max_examples=200)
@given(
    ends=st.lists(st.integers(1, 60), min_size=4, max_size=4),
    stream_runtime=st.integers(1, 5),
    count=st.integers(2, 4),
)
def test_a_stream_of_one_device_jobs_never_starves_the_gang(
    ends: list[int], stream_runtime: int, count: int
) -> None:
    """EXT-GANG-3: every device that frees goes to the gang until it has N, so it
    starts at the pass after the N-th earliest of the running jobs ends, however
    short and many the one-device jobs behind it are."""
    passes, started = _simulate(ends, stream_runtime, count)
    nth = sorted(ends)[count - 1]
    assert started == nth  # passes run each second; the N-th device freed at ``nth``
    assert passes == nth + 1


def test_without_the_claim_the_stream_would_take_each_freed_device() -> None:
    """The rule matters: a gang that claimed nothing would never see two free at once."""
    planner = Planner(_host("h", 4, busy={0, 1, 2}))
    offer = planner.offer(JobSnap("g", seq=1, count=2))
    assert offer.choices == [] and offer.claim == ["h:g0", "h:g3"]
    planner.blocked(JobSnap("g", seq=1, count=2), offer)
    assert planner.offer(JobSnap("s", seq=2)).choices == []  # h:g3 is the gang's


def test_a_job_that_leaves_the_queue_claims_nothing() -> None:
    fleet = _host("h", 2, busy={0})
    gang = JobSnap("g", seq=1, count=2)
    planner = Planner(fleet)
    planner.offer(gang)  # it turned out cancelled: neither placed nor blocked (STORE-063)
    assert planner.offer(replace(gang, id="s", count=1)).choices == [("h:g1",)]
