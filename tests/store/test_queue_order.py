"""The SQL forms of the queue order agree with ``core.scheduling.queue_key`` (STORE-060).

The store reads the queue in SQL order (``queries.QUEUE_ORDER``) a page at a time (keyset
``queries.behind``); the rules decide by the key function. They must name one order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resource_controller.clock import FakeClock
from resource_controller.core.scheduling import aged_queue_key, queue_key, queue_position
from resource_controller.store import passes
from resource_controller.store.facade import Store
from resource_controller.store.jobs import NewJob
from support import store_helpers

if TYPE_CHECKING:
    from conftest import Factory


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    jobs=st.lists(
        st.tuples(
            st.integers(-1, 1),
            st.sampled_from([0, 0, 1]),
            st.sampled_from(["", "box:gpu0", "box:gpu1", "gang"]),
        ),
        min_size=1,
        max_size=9,
    )
)
def test_sql_order_paging_and_positions_follow_the_key(
    store: Store,
    make: Factory,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    jobs: list[tuple[int, int, str]],
) -> None:
    # Positions are counted in SQL (``queries.behind``, ahead; pins matched there): pinned
    # jobs on either device and a gang pinned to both hold it to the rule's count.
    if store_helpers.device(store, "box:gpu0") is None:
        make.worker()
    for priority, wait, pin in jobs:
        clock.advance(wait)
        if pin == "gang":
            make.submit(device_ids=("box:gpu0", "box:gpu1"), count=2, priority=priority)
        else:
            make.submit(device=pin, priority=priority)
    queued = store.views.queued()
    assert [j.id for j in queued] == [
        j.id for j in sorted(queued, key=lambda j: queue_key(j.snap()))
    ]
    monkeypatch.setattr(passes, "QUEUE_PAGE", 2)
    with store.tx() as c:
        assert [r[0] for r in passes.QueueWalk(c)] == [j.id for j in queued]
    snaps = [j.snap() for j in queued]
    for j in queued:
        assert store_helpers.job_with_position(store, j.id)[1] == queue_position(j.snap(), snaps)
    for j in queued:
        store.queue.cancel(j.id, "done")


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    jobs=st.lists(
        st.tuples(st.integers(-10, 10), st.sampled_from([0, 0, 1, 7, 40]), st.booleans()),
        min_size=1,
        max_size=9,
    ),
    aging=st.sampled_from([1, 5, 30]),
    later=st.integers(0, 400),
)
def test_aged_sql_order_paging_and_positions_follow_the_aged_key(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    jobs: list[tuple[int, int, bool]],
    aging: int,
    later: int,
) -> None:
    # EXT-FAIR-1: queued lists, the pass's paged walk and queue positions all use the
    # effective priority at the store's now, and agree with ``aged_queue_key``.
    clock = FakeClock()
    store = Store(tmp_path_factory.mktemp("aged") / "rc.db", clock, priority_aging=aging)
    try:
        store.devices.register("box", "b", [("gpu0", 0)])
        for priority, wait, pinned in jobs:
            clock.advance(wait)
            store.queue.enqueue(
                NewJob(
                    command=["x"],
                    submitter="a",
                    device_id="box:gpu0" if pinned else "",
                    priority=priority,
                )
            )
        clock.advance(later)
        now = store.now()
        key = aged_queue_key(now, aging)
        queued = store.views.queued()
        assert [j.id for j in queued] == [j.id for j in sorted(queued, key=lambda j: key(j.snap()))]
        monkeypatch.setattr(passes, "QUEUE_PAGE", 2)
        with store.tx() as c:
            walked = [r[0] for r in passes.QueueWalk(c, now, aging)]
        assert walked == [j.id for j in queued]
        snaps = [j.snap() for j in queued]
        for j in queued:
            assert store_helpers.job_with_position(store, j.id)[1] == queue_position(
                j.snap(), snaps, key
            )
    finally:
        store.close()
