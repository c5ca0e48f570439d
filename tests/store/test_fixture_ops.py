"""Two operations no route calls: direct allocation (STORE-069) and active job on a device
(STORE-074). The spec requires both to exist; these tests hold them to it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from resource_controller import errors
from resource_controller.clock import FakeClock
from resource_controller.store.facade import Store
from support import store_helpers

from .dbview import Raw, invariant_violations

if TYPE_CHECKING:
    from conftest import Factory


@pytest.mark.parametrize("ceiling", [0, 3600])
def test_direct_allocation_takes_a_ready_device(
    store: Store, make: Factory, raw: Raw, ceiling: int
) -> None:
    d0, _ = make.worker(max_runtime_seconds=ceiling)
    now = store.now()
    job = store_helpers.allocate_directly(store, d0, "alice")
    assert (job.state, job.device_id, job.queued_at, job.priority) == ("assigned", d0, 0, 0)
    (lease,) = raw.live_leases(d0)
    assert (lease["job_id"], lease["holder"], lease["kind"]) == (job.id, "alice", "job")
    assert lease["expires_at"] == now + 300  # default TTL 5 min when <= 0 (STORE-052)
    assert store_helpers.device(store, d0).state == "busy"  # type: ignore[union-attr]
    assert invariant_violations(raw) == []


def test_direct_allocation_ttl_key_and_refusal(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    d0, d1 = make.worker()
    job = store_helpers.allocate_directly(store, d0, "alice", ttl=60, key="k")
    assert raw.live_leases(d0)[0]["expires_at"] == store.now() + 60
    clock.advance(5)
    again = store_helpers.allocate_directly(store, d1, "bob", key="k")
    assert again.id == job.id  # STORE-056 step 3
    assert raw.live_leases(d1) == []
    with pytest.raises(errors.NoDeviceAvailable):
        store_helpers.allocate_directly(store, d0, "bob")  # busy
    with pytest.raises(errors.NoDeviceAvailable):
        store_helpers.allocate_directly(store, "box:nope", "bob")


def test_active_job_on_a_device(store: Store, make: Factory, raw: Raw) -> None:
    d0, d1 = make.worker()
    assert store.views.active_job_on(d0) == ""
    started = make.start(device=d0)
    raw.force_device(d1, "unhealthy", "fault")
    make.submit(device=d1)  # stays queued: a queued job is not active on its device
    store.queue.run_pass()
    assert store.views.active_job_on(d0) == started.id
    assert store.views.active_job_on(d1) == ""
    store_helpers.release(store, started.id, "succeeded", 0)
    assert store.views.active_job_on(d0) == ""
    assert store.views.active_job_on("box:nope") == ""
