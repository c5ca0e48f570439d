"""The store's scheduling pass does what ``core.passloop.plan`` decides (STORE-061,
STORE-062, EXT-GANG-2/3, EXT-DRAIN, EXT-SHARE-1/2: submitter limits and jobs waiting for
others).

The pass takes shortcuts the rules do not (a pinned job behind an unavailable device is
claimed without building its offer; rows are read a page at a time on their scheduling
columns), so over random fleets and queues its assignments and reservation rows are
held to the plan the rules make on the same snapshot.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from resource_controller import errors
from resource_controller.clock import FakeClock
from resource_controller.core import passloop, share
from resource_controller.store import passes, queries, sql
from resource_controller.store.facade import Store
from resource_controller.store.fleet import FleetSnapshot
from resource_controller.store.jobs import NewJob
from support import store_helpers

HOSTS = ("a", "b", "c")
DEVICES = [f"{h}:gpu{i}" for h in HOSTS for i in range(3)]

#: What happens to a device before the queue forms.
FATES = st.sampled_from(["ready", "ready", "ready", "held", "held", "draining", "unhealthy"])

JOBS = st.one_of(
    st.builds(lambda d: {"device_id": d}, st.sampled_from(DEVICES)),
    st.builds(lambda d: {"device_id": d}, st.sampled_from(DEVICES[:3])),  # crowded pins
    st.builds(
        lambda ds: {"device_ids": tuple(sorted(set(ds)))},
        st.lists(st.sampled_from(DEVICES[:3]), min_size=2, max_size=2, unique=True),
    ),
    st.builds(lambda s: {"selector": s}, st.sampled_from(["", "kind=big", "kind=small"])),
    st.builds(lambda n: {"count": n}, st.integers(2, 3)),
)
#: EXT-SHARE: whose job it is (``holder`` holds the devices fated ``held``), and whether
#: it waits for an earlier job of the queue.
JOBS = st.builds(
    lambda ask, who, after: {**ask, "submitter": who, **({"after": after} if after else {})},
    JOBS,
    st.sampled_from(["s", "s", "t", "holder"]),
    st.one_of(st.none(), st.none(), st.none(), st.integers(0, 30)),
)
LIMITS = [
    share.NO_LIMITS,
    share.SubmitterLimits(default=1),
    share.SubmitterLimits(default=2, names={"holder": 3}),
    share.SubmitterLimits(names={"s": 1, "t": 0}),
]


def _fleet(store: Store, fates: list[str]) -> None:
    """Three hosts of three devices (``kind`` big, big, small), each then given its fate."""
    for host in HOSTS:
        names = [f"gpu{i}" for i in range(3)]
        store.devices.register(host, "boot", [(n, 0) for n in names])
        kinds = {n: {"kind": "big" if i < 2 else "small"} for i, n in enumerate(names)}
        store.devices.apply_facts(host, names, None, kinds, None, None)
    for device_id, fate in zip(DEVICES, fates, strict=True):
        if fate == "held":
            store_helpers.allocate_directly(store, device_id, "holder")
        elif fate == "draining":
            store.devices.drain(device_id, "ops", "maintenance")
        elif fate == "unhealthy":
            store.devices.set_state(device_id, "unhealthy", "test")


def _pass_is_the_plan(store: Store) -> None:
    """One pass places and reserves exactly what ``plan`` decides on the same snapshot,
    in the store's queue order (aged at its clock when aging is on, EXT-FAIR-1)."""
    with store.read() as db:
        fleet = FleetSnapshot().read(db)[1]
    queued = [j.snap() for j in store.views.queued()]
    held = store.views.held_by_share()
    expected = passloop.plan(queued, fleet, store.key(store.now()), store.limits, held)

    placed = store.queue.run_pass().assigned

    got = {}
    for a in placed:
        job = store.views.job(a.job_id)
        got[job.id] = tuple(sorted(job.device_ids or (job.device_id,)))
    assert got == {j: tuple(sorted(ds)) for j, ds in expected.assignments.items()}
    with store.read() as db:
        rows = dict(db.execute("SELECT device_id, job_id FROM reservations").fetchall())
    assert rows == expected.reservations


def _pages(monkeypatch: pytest.MonkeyPatch, page: int, batch: int) -> None:
    monkeypatch.setattr(passes, "FIRST_PAGE", page)
    monkeypatch.setattr(passes, "QUEUE_PAGE", page)
    monkeypatch.setattr(passes, "WHOLE_BATCH", batch)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    fates=st.lists(FATES, min_size=len(DEVICES), max_size=len(DEVICES)),
    queue=st.lists(st.tuples(JOBS, st.integers(-1, 1), st.sampled_from([0, 0, 1])), max_size=24),
    page=st.sampled_from([1, 2, 32]),
    batch=st.sampled_from([0, 1, 512]),
    aging=st.sampled_from([0, 0, 1]),
    later=st.sampled_from([0, 90]),
    limits=st.sampled_from(LIMITS),
)
@example(  # aged, the older job of lower priority goes first (EXT-FAIR-1)
    fates=["ready"] * len(DEVICES),
    queue=[({"device_id": "a:gpu0"}, 0, 0), ({"device_id": "a:gpu0"}, 1, 5)],
    page=32,
    batch=512,
    aging=1,
    later=90,
    limits=share.NO_LIMITS,
)
@example(  # s at its limit of 1: its second job claims nothing, t's job behind is placed
    fates=["held"] + ["ready"] * (len(DEVICES) - 1),
    queue=[
        ({"device_id": "a:gpu1", "submitter": "s"}, 0, 0),
        ({"device_id": "a:gpu2", "submitter": "s"}, 0, 1),
        ({"device_id": "a:gpu2", "submitter": "t"}, 0, 1),
        ({"device_id": "a:gpu2", "submitter": "t", "after": 0}, 1, 1),
    ],
    page=32,
    batch=512,
    aging=0,
    later=0,
    limits=share.SubmitterLimits(default=1),
)
def test_the_pass_places_and_reserves_what_the_plan_does(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    fates: list[str],
    queue: list[tuple[dict[str, Any], int, int]],
    page: int,
    batch: int,
    aging: int,
    later: int,
    limits: share.SubmitterLimits,
) -> None:
    _pages(monkeypatch, page, batch)
    clock = FakeClock()
    store = Store(tmp_path_factory.mktemp("plan") / "rc.db", clock, priority_aging=aging)
    store.limits = limits
    try:
        _fleet(store, fates)
        queued: list[str] = []
        for ask, priority, wait in queue:
            clock.advance(wait)
            fields = {"submitter": "s", **ask}
            after = fields.pop("after", None)
            if after is not None and queued:  # EXT-SHARE-2: waits for an earlier one
                fields["after"] = (queued[after % len(queued)],)
            with contextlib.suppress(errors.RcError):  # asks no host could ever meet
                job = store.queue.enqueue(NewJob(command=["x"], priority=priority, **fields))
                queued.append(job.id)
        clock.advance(later)  # aged, a job's place moves with the clock
        _pass_is_the_plan(store)
    finally:
        store.close()


@pytest.mark.parametrize("batch", [0, 1, 2, 512])
def test_narrow_pages_read_the_rows_a_turn_needs(
    store: Store, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, batch: int
) -> None:
    """Behind a page of plain pins the walk reads narrow rows; the jobs among them that
    are not plain pins, and a plain pin whose device is free, are read whole when their
    turn comes, a batch at a time, and the pass still does what the plan does."""
    _pages(monkeypatch, 4, batch)
    _fleet(store, ["held"] * 3 + ["ready"] * 6)
    asks: list[dict[str, Any]] = [{"device_id": f"a:gpu{i % 3}"} for i in range(8)]
    asks += [
        {"selector": "kind=small"},
        {"device_id": "b:gpu0"},  # a plain pin on a free device: placed
        {"device_ids": ("b:gpu1", "b:gpu2")},
        {"count": 2},
        {"device_id": "a:gpu1"},
        {"selector": "kind=big"},
        {"device_id": "b:gpu0"},  # behind the one placed there: claims it
        {"count": 3},
    ]
    for ask in asks:
        clock.advance(1)
        store.queue.enqueue(NewJob(command=["x"], submitter="s", **ask))
    reads: list[int] = []
    queue_rows = queries.queue_rows

    def counted(conn: sql.Db, job_ids: list[str]) -> Sequence[object]:
        reads.append(len(job_ids))
        return queue_rows(conn, job_ids)

    monkeypatch.setattr(queries, "queue_rows", counted)
    _pass_is_the_plan(store)
    assert reads, "no narrow row was read whole"
    # Each read is the turn's job and at most a batch behind it; a batch is used.
    assert max(reads) <= batch + 1
    assert max(reads) > 1 if batch else max(reads) == 1
