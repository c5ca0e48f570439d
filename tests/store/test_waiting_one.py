"""One queued job's ``waiting_for`` (its view, polled by whoever waits for it) reads
only the job and the jobs holding reservations, not the whole queue; it must say what
the answer for every queued job at once (``/v1/state``) says of that job (EXT-WHY-1)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import Factory
from resource_controller.clock import FakeClock
from resource_controller.store import views
from resource_controller.store.facade import Store

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
        _check(store, Factory(store), jobs, busy)
    finally:
        store.close()


def _check(store: Store, make: Factory, jobs: list[tuple[str, int]], busy: set[str]) -> None:
    make.worker(devices=3)
    for device in sorted(busy):
        make.start(device=device)
    for pin, priority in jobs:
        if pin == "gang":
            make.submit(count=2, priority=priority)  # claims what it cannot yet have
        else:
            make.submit(device=pin, priority=priority)
    store.schedule()
    queued = store.queued_jobs()
    with store._tx() as c:
        every = views.waiting_for_all(c, queued, store._key(store.now()), store._fleet)
    for job in queued:
        assert store.waiting_for(job) == every[job.id], job
