"""One queued job's ``waiting_for`` (its view, polled by whoever waits for it) reads
only the job and the jobs holding reservations, not the whole queue; it must say what
the answer for every queued job at once (``/v1/state``) says of that job (EXT-WHY-1)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resource_controller.clock import FakeClock
from resource_controller.store import jobs as queue_jobs
from resource_controller.store.facade import Store
from resource_controller.store.jobs import NewJob

PINS = ["", "box:gpu0", "box:gpu1", "box:gpu2", "gang", "gang"]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    jobs=st.lists(st.tuples(st.sampled_from(PINS), st.integers(-1, 1)), min_size=1, max_size=8),
    busy=st.sets(st.sampled_from(["box:gpu0", "box:gpu1", "box:gpu2"]), max_size=2),
)
def test_one_jobs_waits_are_what_the_whole_queue_says_of_it(
    tmp_path_factory: pytest.TempPathFactory, jobs: list[tuple[str, int]], busy: set[str]
) -> None:
    store = Store(tmp_path_factory.mktemp("waits") / "rc.db", FakeClock())
    try:
        _check(store, jobs, busy)
    finally:
        store.close()


def _check(store: Store, jobs: list[tuple[str, int]], busy: set[str]) -> None:
    store.devices.register("box", "boot-1", [(f"gpu{i}", 0) for i in range(3)])
    for device in sorted(busy):
        store.queue.enqueue(NewJob(command=["x"], submitter="holder", device_id=device))
    store.queue.run_pass()  # the busy devices are taken
    for pin, priority in jobs:
        if pin == "gang":  # claims what it cannot yet have
            req = NewJob(command=["x"], submitter="a", count=2, priority=priority)
        else:
            req = NewJob(command=["x"], submitter="a", device_id=pin, priority=priority)
        store.queue.enqueue(req)
    store.queue.run_pass()
    queued = store.views.queued()
    with store.tx() as c:
        every = queue_jobs.waiting_for_all(c, store, queued, store.now())
    for job in queued:
        assert store.queue.waiting_for(job) == every[job.id], job
