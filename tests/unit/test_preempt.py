"""The pure rule of preemption (EXT-PREEMPT-1, EXT-PREEMPT-4): which running jobs a waiting job
stops, on one host, and what it claims while they stop."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from resource_controller.core import preempt
from resource_controller.core.passloop import plan
from resource_controller.core.preempt import Preemption, Running
from resource_controller.core.scheduling import DeviceSnap, JobSnap
from resource_controller.core.states import DeviceState

NOW = 10_000
BUSY = DeviceState.BUSY


def fleet(*hosts: tuple[str, int], busy: Sequence[str] = ()) -> list[DeviceSnap]:
    out = []
    for host, n in hosts:
        for i in range(n):
            d = f"{host}-{i}"
            out.append(DeviceSnap(d, host, BUSY if d in busy else DeviceState.READY))
    return out


def preemption(
    running: Sequence[Running], min_runtime: int = 60, promised: Mapping[str, str] | None = None
) -> Preemption:
    return Preemption(lambda: running, lambda: promised or {}, NOW, min_runtime)


def run(r: str, *devices: str, priority: int = 0, age: int = 600, **kw: object) -> Running:
    return Running(r, tuple(devices), priority, NOW - age, **kw)  # type: ignore[arg-type]


def test_a_waiting_job_stops_the_lowest_priority_victim_and_claims_its_device() -> None:
    """EXT-PREEMPT-1: lowest priority first."""
    devices = fleet(("a", 2), busy=["a-0", "a-1"])
    running = [run("low", "a-0", priority=-5), run("mid", "a-1", priority=0)]
    got = plan([JobSnap("w", 1)], devices, preemption=preemption(running))
    assert got.preempt == {"low": "w"}
    assert got.reservations == {"a-0": "w"}
    assert got.assignments == {}


def test_equal_priority_the_most_recently_started_goes() -> None:
    """EXT-PREEMPT-1: then the most recently started (least work lost)."""
    devices = fleet(("a", 2), busy=["a-0", "a-1"])
    running = [run("old", "a-0", age=5000), run("new", "a-1", age=100)]
    got = plan([JobSnap("w", 1)], devices, preemption=preemption(running))
    assert got.preempt == {"new": "w"}


def test_a_job_in_its_first_min_runtime_is_never_chosen() -> None:
    """EXT-PREEMPT-1: never a job in its first ``preempt_min_runtime``."""
    devices = fleet(("a", 2), busy=["a-0", "a-1"])
    running = [run("young", "a-0", age=30), run("grown", "a-1", age=90, priority=3)]
    got = plan([JobSnap("w", 1)], devices, preemption=preemption(running, min_runtime=60))
    assert got.preempt == {"grown": "w"}
    assert plan([JobSnap("w", 1)], devices, preemption=preemption(running[:1])).preempt == {}
    # Not yet started counts as just started.
    fresh = [Running("fresh", ("a-0",), 0, 0)]
    assert plan([JobSnap("w", 1)], devices, preemption=preemption(fresh)).preempt == {}
    assert plan([JobSnap("w", 1)], devices, preemption=preemption(fresh, 0)).preempt == {
        "fresh": "w"
    }


def test_never_a_hold() -> None:
    devices = fleet(("a", 1), busy=["a-0"])
    running = [run("h", "a-0", hold=True)]
    assert plan([JobSnap("w", 1)], devices, preemption=preemption(running)).preempt == {}


def test_victims_are_on_one_host_and_together_free_what_it_needs() -> None:
    """EXT-PREEMPT-1: a 2-device job stops two victims of one host, never one on each."""
    devices = fleet(("a", 2), ("b", 2), busy=["a-0", "b-0", "b-1"])
    running = [run("b0", "b-0", priority=-1), run("b1", "b-1", priority=-1), run("a0", "a-0")]
    got = plan([JobSnap("w", 1, count=2)], devices, preemption=preemption(running))
    # On a: one free device and one victim; on b: two victims of lower priority.
    assert got.preempt in ({"b0": "w", "b1": "w"}, {"a0": "w"})
    victims_hosts = {v[0] for v in got.preempt}
    assert len(victims_hosts) == 1
    # The lowest priority stopped is the rule's first word: b's two at -1 beat a's one at 0.
    assert got.preempt == {"b0": "w", "b1": "w"}
    assert sorted(got.reservations) == ["b-0", "b-1"]


def test_a_victim_is_never_chosen_twice() -> None:
    """EXT-PREEMPT-4: a job already being stopped (for anyone) is not chosen again; its own
    waiting job waits for it and chooses no more."""
    devices = fleet(("a", 2), busy=["a-0", "a-1"])
    running = [run("v0", "a-0", preempted_by="w"), run("v1", "a-1")]
    got = plan([JobSnap("w", 1)], devices, preemption=preemption(running))
    assert got.preempt == {}
    assert got.reservations == {"a-0": "w"}
    # Another waiting job cannot have v0 either, and two in one pass take one victim each.
    got = plan([JobSnap("w", 1), JobSnap("x", 2)], devices, preemption=preemption(running))
    assert got.preempt == {"v1": "x"}
    got = plan(
        [JobSnap("x", 1), JobSnap("y", 2), JobSnap("z", 3)],
        fleet(("a", 2), busy=["a-0", "a-1"]),
        preemption=preemption([run("v0", "a-0"), run("v1", "a-1")]),
    )
    assert sorted(got.preempt) == ["v0", "v1"]
    assert len(set(got.preempt.values())) == 2


def test_only_a_non_preemptible_or_higher_priority_job_preempts() -> None:
    devices = fleet(("a", 1), busy=["a-0"])
    running = [run("v", "a-0", priority=1)]
    same = JobSnap("p", 1, priority=1, preemptible=True)
    higher = JobSnap("q", 1, priority=2, preemptible=True)
    assert plan([same], devices, preemption=preemption(running)).preempt == {}
    assert plan([higher], devices, preemption=preemption(running)).preempt == {"v": "q"}
    assert plan([JobSnap("n", 1, priority=-3)], devices, preemption=preemption(running)).preempt


def test_a_waiting_scavenger_ahead_does_not_keep_the_device_from_a_preempting_job() -> None:
    """The claim of a preemptible job ahead is taken over; the walk goes on past it."""
    devices = fleet(("a", 1), busy=["a-0"])
    scav = JobSnap("s", 1, queued_at=1, preemptible=True)
    real = JobSnap("w", 2, queued_at=2)
    got = plan([scav, real], devices, preemption=preemption([run("v", "a-0")]))
    assert got.preempt == {"v": "w"}
    assert got.reservations == {"a-0": "w"}


def test_a_requeued_victim_does_not_retake_a_device_promised_to_its_preemptor() -> None:
    """EXT-PREEMPT-1: the devices stay reserved for the waiting job until it runs."""
    devices = fleet(("a", 1))
    victim = JobSnap("v", 1, queued_at=1, preemptible=True)
    real = JobSnap("w", 2, queued_at=2)
    got = plan([victim, real], devices, preemption=preemption([], promised={"a-0": "w"}))
    assert got.assignments == {"w": ("a-0",)}
    assert plan([victim, real], devices).assignments == {"v": ("a-0",)}


def test_off_or_nothing_running_changes_nothing() -> None:
    devices = fleet(("a", 1), busy=["a-0"])
    assert plan([JobSnap("w", 1)], devices).preempt == {}
    assert plan([JobSnap("w", 1)], devices, preemption=preemption([])).preempt == {}


def test_grace_the_victims_own_may_shorten_the_controllers() -> None:
    """EXT-PREEMPT-2."""
    assert preempt.grace(0, 30) == 30
    assert preempt.grace(5, 30) == 5
    assert preempt.grace(50, 30) == 30
