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
from resource_controller.core.scheduling import queue_key, queue_position
from resource_controller.store import leases
from resource_controller.store.facade import Store

if TYPE_CHECKING:
    from conftest import Factory


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    jobs=st.lists(
        st.tuples(st.integers(-1, 1), st.sampled_from([0, 0, 1]), st.booleans()),
        min_size=1,
        max_size=9,
    )
)
def test_sql_order_paging_and_positions_follow_the_key(
    store: Store,
    make: Factory,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    jobs: list[tuple[int, int, bool]],
) -> None:
    if store.device("box:gpu0") is None:
        make.worker()
    for priority, wait, pinned in jobs:
        clock.advance(wait)
        make.submit(device="box:gpu0" if pinned else "", priority=priority)
    queued = store.queued_jobs()
    assert [j.id for j in queued] == [
        j.id for j in sorted(queued, key=lambda j: queue_key(j.snap()))
    ]
    monkeypatch.setattr(leases, "QUEUE_PAGE", 2)
    assert [j.id for j in leases._queued_in_order(store._tx)] == [j.id for j in queued]
    snaps = [j.snap() for j in queued]
    for j in queued:
        assert store.job_with_position(j.id)[1] == queue_position(j.snap(), snaps)
    for j in queued:
        store.cancel_queued(j.id, "done")
